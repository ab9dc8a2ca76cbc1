"""A model's chat template (`chat_template.jinja`, Hugging Face's file for it): the Jinja text that
turns a conversation into the prompt the model was tuned on. Rendered in Jinja's immutable
sandbox, since a template arrives inside someone else's model file: it may loop and branch, but
not reach Python's attributes or change anything outside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path

CHAT_TEMPLATE = "chat_template.jinja"


def _environment() -> Any:
    """As transformers' apply_chat_template compiles one: blocks trimmed, loop controls, and
    `raise_exception` for the templates that refuse a conversation."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
    environment.globals["raise_exception"] = _refuse
    return environment


def _refuse(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def check_chat_template(path: Path) -> None:
    """Refuse, in one line, a file that is not UTF-8 Jinja."""
    from jinja2 import TemplateSyntaxError

    try:
        _environment().from_string(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, TemplateSyntaxError) as exc:
        raise ZooError(f"{display_path(path)}: not a chat template: {exc}") from exc


def render_chat(path: Path, messages: list[dict[str, str]], bos: str = "", eos: str = "") -> str:
    """The prompt text for `messages` ({role, content} each), ending where the assistant's
    reply begins (add_generation_prompt, as transformers' apply_chat_template)."""
    from jinja2 import TemplateError

    try:
        template = _environment().from_string(Path(path).read_text(encoding="utf-8"))
        return template.render(messages=messages, add_generation_prompt=True, bos_token=bos,
                               eos_token=eos)
    except (UnicodeDecodeError, TemplateError) as exc:  # the sandbox's refusals included
        raise ZooError(f"{display_path(path)}: the chat template failed: {exc}") from exc
