"""The one exception type of data_prep: a message that says what is wrong and how to fix it."""


class DataPrepError(RuntimeError):
    """Bad input, a missing asset or a corrupt shard.

    The CLI prints the message without a traceback, so every message must stand on its own:
    what was found, where, and the command or flag that fixes it.
    """


class OtherPrepareError(DataPrepError):
    """OUT holds a prepare run with other settings or input (`prepare` never overwrites one)."""
