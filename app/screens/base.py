"""The base of velo-chat's full screens: `self.app` typed as the app they run in.

Textual types a widget's `app` as `App[object]`; the screens read velo-chat's own state from it
(the active profile, the store, the engine host), so the type checker is told which app that is.
Only the type checker sees it (`textual.getters.app` is newer than the oldest Textual we support).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen

if TYPE_CHECKING:
    from textual import getters

    from ..app import VeloChatApp


class VeloScreen(Screen[None]):
    if TYPE_CHECKING:
        app = getters.app(VeloChatApp)
