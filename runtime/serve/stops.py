"""Stop strings found in an answer's text as it grows, in time linear in the text.

The text is decoded again after every token, so it grows at its end, except that its last
characters may change (a piece of a character becomes the character). One Knuth-Morris-Pratt
automaton per stop string is fed each new character once and keeps its state after every
character: a changed tail rewinds to the longest common prefix and is fed again. So a token
costs time in its own characters, never in the stop strings' length: a client's 1 MB stop
string (refused now past MAX_STOP_CHARS anyway) once cost its length squared a token, on the
scheduler's thread that every client's stream waits on. The tables are built once per request
(`StopFinder(stops)`), on the event loop, before the request is queued."""

from __future__ import annotations

from dataclasses import dataclass


def failure_table(stop: str) -> list[int]:
    """table[i]: the length of the longest proper prefix of stop[:i + 1] that is also its
    suffix (Knuth-Morris-Pratt's failure function)."""
    table = [0] * len(stop)
    length = 0
    for index in range(1, len(stop)):
        while length and stop[index] != stop[length]:
            length = table[length - 1]
        if stop[index] == stop[length]:
            length += 1
        table[index] = length
    return table


def common_prefix(old: str, new: str) -> int:
    """The length of the longest common prefix of two texts (almost always all of `old`)."""
    if new.startswith(old):
        return len(old)
    low, high = 0, min(len(old), len(new))  # a binary search over C-speed comparisons
    while low < high:
        middle = (low + high + 1) // 2
        if new.startswith(old[:middle]):
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class Found:
    """Where the earliest stop string begins in the text (None: nowhere yet), and how many
    characters at the text's end may begin one (held back from a stream until they do not)."""

    cut: int | None
    held: int


class StopFinder:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.tables = [failure_table(stop) for stop in stops]
        self.text = ""
        # states[s][i]: how much of stop s the text's first i characters end with
        self.states: list[list[int]] = [[0] for _ in stops]

    def update(self, text: str) -> Found:
        """The stop strings in `text`, the answer decoded so far."""
        kept = common_prefix(self.text, text)
        self.text = text
        cut: int | None = None
        for stop, table, states in zip(self.stops, self.tables, self.states, strict=True):
            del states[kept + 1:]
            start = self._feed(stop, table, states, text, kept)
            if start is not None and (cut is None or start < cut):
                cut = start
        held = 0 if cut is not None else max((states[-1] for states in self.states), default=0)
        return Found(cut, held)

    @staticmethod
    def _feed(stop: str, table: list[int], states: list[int], text: str, kept: int
              ) -> int | None:
        """Feed text[kept:] to one automaton; where its first whole match begins, if any."""
        state = states[-1]
        if state == len(stop):  # matched already (the answer ends at a match: not fed again)
            return len(states) - 1 - len(stop)
        for index in range(kept, len(text)):
            char = text[index]
            while state and stop[state] != char:
                state = table[state - 1]
            if stop[state] == char:
                state += 1
            states.append(state)
            if state == len(stop):
                return index + 1 - len(stop)
        return None
