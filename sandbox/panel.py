"""What a sandbox desktop looks like: a wallpaper, and a panel with launchers for the installed apps, a task list and a
clock (tint2), as OSWorld's Ubuntu image and every real desktop have. Without it a new annotator sees a black screen
whose only way in is openbox's hidden right-click menu, and a model trained on it learns a desktop that exists nowhere
else. The panel runs inside the session's sandbox like its other programs; its launchers start apps there too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .isolation import SessionUser

WALLPAPER_RGB = (0x2E, 0x4A, 0x62)  # a calm blue-grey: screenshots stay easy to read
PANEL_CLASSES = frozenset({"Tint2"})  # the panel's WM class: not an application window
PANEL_HEIGHT = 32
LAUNCHERS = [  # Debian's own desktop entries of the apps the sandbox has, in the panel's order
    "/usr/share/applications/debian-xterm.desktop",
    "/usr/share/applications/org.xfce.mousepad.desktop",
    "/usr/share/applications/pcmanfm.desktop",
]

TINT2RC = """\
# Written by the sandbox (sandbox/panel.py) when the desktop starts.
rounded = 0
border_width = 0
background_color = #1b2631 100
border_color = #000000 0

rounded = 3
border_width = 0
background_color = #3d566e 100
border_color = #000000 0

panel_items = LTC
panel_monitor = all
panel_position = bottom center horizontal
panel_size = 100% {height}
panel_margin = 0 0
panel_padding = 6 3 6
panel_background_id = 1
panel_dock = 0
panel_layer = top
wm_menu = 1
strut_policy = follow_size

launcher_padding = 2 2 6
launcher_background_id = 0
launcher_icon_size = 24
launcher_icon_theme = Adwaita
launcher_tooltip = 1
{launchers}

taskbar_mode = single_desktop
taskbar_padding = 4 2 4
taskbar_background_id = 0
task_icon = 1
task_text = 1
task_centered = 0
task_maximum_size = 220 26
task_padding = 6 2 4
task_font = sans 9
task_font_color = #eeeeee 100
task_background_id = 0
task_active_background_id = 2

time1_format = %H:%M
time2_format = %a %d %b
time1_font = sans bold 10
time2_font = sans 8
clock_font_color = #ffffff 100
clock_padding = 8 0
clock_background_id = 0
"""


def available() -> bool:
    return shutil.which("tint2") is not None


def write_config(home: Path, user: SessionUser | None) -> Path:
    """The panel's config in the session's home (the sandbox hides the project's files from the session)."""
    folder = home / ".config" / "tint2"
    folder.mkdir(parents=True, exist_ok=True)
    launchers = "\n".join(f"launcher_item_app = {path}" for path in LAUNCHERS if Path(path).exists())
    path = folder / "tint2rc"
    path.write_text(TINT2RC.format(height=PANEL_HEIGHT, launchers=launchers))
    if user is not None:
        for p in (home / ".config", folder, path):
            os.chown(p, user.uid, user.gid)
    return path
