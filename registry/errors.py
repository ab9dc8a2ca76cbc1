"""Errors a user can cause. The CLI prints them as one line and exits 2."""


class ZooError(Exception):
    """A problem with the user's input: a card, a file, an option. Its message is one line."""


class CardError(ZooError):
    """A card that cannot be read, resolved or validated."""
