"""The local update as composable pieces: precondition -> (mix) -> correct -> modulate -> step."""

from adaptfl.local_update.chain import LocalUpdate, LocalUpdateConfig

__all__ = ["LocalUpdate", "LocalUpdateConfig"]
