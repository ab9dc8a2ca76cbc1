"""A model's chat template (`chat_template.jinja`, Hugging Face's file for it): the Jinja text that
turns a conversation into the prompt the model was tuned on. Rendered in Jinja's immutable
sandbox, since a template arrives inside someone else's model file: it may loop and branch, but
not reach Python's attributes or change anything outside it, and a render is bounded: it stops
after RENDER_SECONDS or RENDER_CHARS of text (the sandbox bounds one `range`, not two nested
ones), and it runs in a worker process whose address space is limited (runtime/files/
chat_worker.py `render_chat`: one operation, as `'%1000000000d' % 1`, can make gigabytes
between two checks); any error inside it is one line naming the file."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from registry.errors import ZooError, first_line
from registry.paths import display_path

CHAT_TEMPLATE = "chat_template.jinja"
# A real chat template renders in milliseconds; 2 s of wall time is hundreds of times that on a
# busy machine, and what a server may spend on one hostile request.
RENDER_SECONDS = 2.0
# A prompt past a million characters (some 250k tokens) is past every context the zoo runs;
# the cap also holds for any one value a template makes (`'x' * n`).
RENDER_CHARS = 1_000_000
_TICK = "zoo_budget_step"  # the global each for-loop's items pass through (see _ticking)
_SHOWN = 300  # characters of an error's message kept in its line


class _OverBudget(Exception):
    """A render that ran past its time or size: not the template's to catch."""


class _Budget:
    """What is left of one render: checked at each loop step, call, operator and piece of text,
    so a loop that writes nothing stops on time as well."""

    def __init__(self, seconds: float, chars: int) -> None:
        self.seconds, self.chars = seconds, chars
        self.deadline = time.monotonic() + seconds
        self.written = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _OverBudget(f"ran past the {self.seconds:g} s a render may take")

    def steps(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            self.tick()
            yield item

    def write(self, piece: str) -> str:
        self.tick()
        self.written += len(piece)
        if self.written > self.chars:
            raise _OverBudget(f"wrote past the {self.chars} characters a render may write")
        return piece

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse a count past the cap given to a call or filter (`'x'.ljust(n)`,
        `center(n)`, `slice(n)`, `lipsum(n)`): what it makes, or loops over, before it runs."""
        self.tick()
        if any(isinstance(value, int) and abs(value) > self.chars
               for value in (*args, *kwargs.values())):
            raise _OverBudget(f"passed a number past the {self.chars} a render may use")

    def operator(self, operator: str, left: Any, right: Any) -> None:
        """Refuse `*` and `**` whose result would pass the cap, before it is made."""
        self.tick()
        if operator == "*":
            sized, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(count, int) and hasattr(sized, "__len__") \
                    and len(sized) * count > self.chars:
                raise _OverBudget(f"made a value of more than the {self.chars} items a "
                                  "render may hold (with *)")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and right * abs(left).bit_length() > self.chars:
            raise _OverBudget(f"made a number of more than the {self.chars} bits a render "
                              "may hold (with **)")


@functools.cache
def _sandbox() -> type:
    """Jinja's immutable sandbox with the budget's checks on calls and operators."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def __init__(self, budget: _Budget, **options: Any) -> None:
            super().__init__(**options)
            self.budget = budget

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            self.budget.arguments(args, kwargs)  # a macro calling itself twice per level
            return super().call(context, obj, *args, **kwargs)  # loops without a for

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.budget.operator(operator, left, right)
            return super().call_binop(context, operator, left, right)

    return Bounded


def _environment(budget: _Budget) -> Any:
    """As transformers' apply_chat_template compiles one (blocks trimmed, loop controls,
    `raise_exception` for the templates that refuse a conversation), without the compile-time
    optimizer, which would run a constant expression before any budget applies."""
    from jinja2.ext import loopcontrols

    environment = _sandbox()(budget, trim_blocks=True, lstrip_blocks=True,
                             extensions=[loopcontrols], optimized=False)
    environment.globals["raise_exception"] = _refuse
    environment.globals[_TICK] = budget.steps
    environment.filters["tojson"] = _tojson
    environment.filters = {name: _checked(budget, filter_)
                           for name, filter_ in environment.filters.items()}
    return environment


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson`: keys in their order and no HTML escaping (Jinja's own sorts the
    keys and escapes <, > and &, so a template showing tools as JSON (Qwen2.5's) would show
    the model another text than transformers does)."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _checked(budget: _Budget, filter_: Any) -> Any:
    """A filter whose arguments pass the budget first (Jinja calls filters directly, not
    through the sandbox's `call`); wraps keeps the marks that ask Jinja for the context."""
    @functools.wraps(filter_)
    def checked(*args: Any, **kwargs: Any) -> Any:
        budget.arguments(args, kwargs)
        return filter_(*args, **kwargs)

    return checked


def _ticking(environment: Any, source: str) -> Any:
    """The template compiled with every for-loop's items passed through the budget's steps."""
    from jinja2 import nodes

    tree = environment.parse(source)
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Call(nodes.Name(_TICK, "load", lineno=loop.lineno), [loop.iter], [],
                               None, None, lineno=loop.lineno)
    tree.set_environment(environment)
    return environment.from_string(tree)


def _refuse(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def size_checked(path: Path) -> Path:
    """`path`, refused unread where it is larger than any prompt it could make (real chat
    templates are a few KB; the parser would hold a huge one whole)."""
    size = Path(path).stat().st_size
    if size > RENDER_CHARS:
        raise ZooError(f"{display_path(path)}: a chat template of {size} bytes, past the "
                       f"{RENDER_CHARS} the zoo reads")
    return Path(path)


def check_chat_template(path: Path) -> None:
    """Refuse, in one line, a file that is not UTF-8 Jinja (compiling runs none of it)."""
    source = size_checked(path)
    try:
        _ticking(_environment(_Budget(RENDER_SECONDS, RENDER_CHARS)),
                 source.read_text(encoding="utf-8"))
    except Exception as exc:  # a syntax error, or what Jinja's parser raises on odd input
        raise ZooError(f"{display_path(path)}: not a chat template: {_said(exc)}") from exc


class RenderRefused(Exception):
    """A render refused (past its budget, or the template's own error): the line after the
    template's path in the ZooError that runtime/files/chat_worker.py `render_chat` raises."""


def render_source(source: str, messages: list[dict[str, Any]], bos: str, eos: str,
                  seconds: float, chars: int, tools: list[dict[str, Any]] | None = None,
                  generation_prompt: bool = True) -> str:
    """The prompt text for `messages` from a template's text, in this process (the worker's
    part of `render_chat`)."""
    budget = _Budget(seconds, chars)
    try:
        template = _ticking(_environment(budget), source)
        extra = {"tools": tools} if tools else {}  # as transformers' apply_chat_template
        pieces = template.generate(messages=messages, add_generation_prompt=generation_prompt,
                                   bos_token=bos, eos_token=eos, **extra)
        return "".join(budget.write(piece) for piece in pieces)
    except _OverBudget as exc:
        raise RenderRefused(f"refused the chat template: it {exc}") from exc
    except MemoryError:  # the worker's address-space limit, met inside one operation
        raise RenderRefused("refused the chat template: it needed more memory than a render "
                            "may use") from None
    except Exception as exc:  # the sandbox's refusals, and Python's errors inside it
        raise RenderRefused(f"the chat template failed: {_said(exc)}") from exc


def _said(exc: Exception) -> str:
    """An error's message as one short line: its type where it is Python's own (TypeError,
    RecursionError), since the message alone may not say what went wrong."""
    from jinja2 import TemplateError

    said = first_line(exc) if isinstance(exc, TemplateError) \
        else f"{type(exc).__name__}: {first_line(exc)}"
    return said if len(said) <= _SHOWN else said[:_SHOWN] + "..."
