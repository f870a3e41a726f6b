"""Browser families that take several steps: a drop-down, a slider, a long list to scroll, a form to fill and submit,
a menu bar (with submenus at level 2) and tabs."""

from __future__ import annotations

import random
from typing import Any

from .core import register
from .page import (
    Point,
    click,
    document,
    drag,
    esc,
    finished,
    fix_input,
    in_view,
    js,
    scroll_towards,
)
from .web_basic import BrowserFamily
from .words import FIELD_VALUES, FIELDS, LABELS, MENUS, SUBMENUS, WORDS


@register
class Dropdown(BrowserFamily):
    name = "dropdown"
    levels = (1, 2, 3)
    summary = "open a drop-down and pick an option (4 or 7 options; level 3: the right one of two drop-downs)"

    NAMES = ("Language", "Theme", "Region", "Font", "Currency", "Timezone")

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n, k = (1, 4) if difficulty == 1 else (1, 7) if difficulty == 2 else (2, 5)
        names = rng.sample(self.NAMES, n)
        xs = rng.sample(range(60, 900, 300), n)
        drops = [{"name": name, "options": rng.sample(WORDS, k), "pos": [x, rng.randint(60, 240)]}
                 for name, x in zip(names, xs, strict=True)]  # fmt: skip
        target = rng.randrange(n)
        return {"drops": drops, "target": target, "option": rng.randrange(k)}

    def _want(self, spec: dict[str, Any]) -> str:
        return spec["drops"][spec["target"]]["options"][spec["option"]]

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Pick '{self._want(spec)}' from the {spec['drops'][spec['target']]['name']} drop-down."

    def page(self, spec: dict[str, Any]) -> str:
        body = ""
        for d, drop in enumerate(spec["drops"]):
            x, y = drop["pos"]
            options = "".join(
                f"<div data-key='d{d}o{o}' style='height:36px;line-height:36px;padding:0 10px;"
                "border-bottom:1px solid #ddd'"
                f" onclick='pick({d},{js(opt)})'>{esc(opt)}</div>"
                for o, opt in enumerate(drop["options"])
            )
            body += (
                f"<div class='abs' style='left:{x}px;top:{y}px;width:240px'>"
                f"<span class='lbl'>{esc(drop['name'])}</span>"
                f"<button data-key='d{d}' style='width:240px;text-align:left' onclick='toggle({d})'>Choose…</button>"
                f"<div id='list{d}' style='display:none;background:#fff;border:1px solid #678'>{options}</div></div>"
            )
        script = (
            f"S.values={js([None] * len(spec['drops']))};S.open=null;"
            "function toggle(d){const o=S.open===d?null:d;S.open=o;"
            "document.querySelectorAll('[id^=list]').forEach((l,i)=>l.style.display=i===o?'block':'none')}"
            "function pick(d,v){S.values[d]=v;document.querySelector(`[data-key=d${d}]`).textContent=v;toggle(d);"
            "status('Picked '+v)}"
        )
        return document("Drop-down", body, script)

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return f"S.values[{spec['target']}]", self._want(spec)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        t = spec["target"]
        if state["st"]["values"][t] == self._want(spec):
            return finished(f"picked {self._want(spec)}")
        option = state["els"][f"d{t}o{spec['option']}"]
        return click(option) if option["shown"] else click(state["els"][f"d{t}"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        t, other = spec["target"], (spec["option"] + 1) % len(spec["drops"][spec["target"]]["options"])
        option = state["els"][f"d{t}o{other}"]
        return click(option) if option["shown"] else click(state["els"][f"d{t}"])


@register
class Slider(BrowserFamily):
    name = "slider"
    levels = (1, 2, 3)
    summary = "drag a slider's handle to a value (steps of 10 or 5; level 3: the right one of two sliders)"

    NAMES = ("Volume", "Brightness", "Contrast", "Speed", "Balance", "Opacity")
    WIDTH = 500

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n, step = (1, 10) if difficulty == 1 else (1, 5) if difficulty == 2 else (2, 10)
        names = rng.sample(self.NAMES, n)
        ys = rng.sample(range(120, 600, 160), n)
        values = list(range(0, 101, step))
        sliders = [{"name": name, "x": rng.randint(200, 1280 - self.WIDTH - 160), "y": y, "start": rng.choice(values)}
                   for name, y in zip(names, ys, strict=True)]  # fmt: skip
        target = rng.randrange(n)
        value = rng.choice([v for v in values if v != sliders[target]["start"]])
        return {"sliders": sliders, "step": step, "target": target, "value": value}

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Drag the {spec['sliders'][spec['target']]['name']} slider to {spec['value']}."

    def page(self, spec: dict[str, Any]) -> str:
        w = self.WIDTH
        body = "".join(
            f"<div class='abs lbl' style='left:{s['x'] - 170}px;top:{s['y'] - 12}px;width:160px'>{esc(s['name'])}:"
            f" <b id='v{i}'></b></div><div class='abs' data-key='s{i}' style='left:{s['x']}px;top:{s['y']}px;"
            f"width:{w}px;height:12px;background:#abc;border-radius:6px' onmousedown='grab({i},event)'></div>"
            f"<div class='abs' data-key='h{i}' style='top:{s['y'] - 12}px;width:24px;height:36px;background:#345;"
            f"border-radius:4px' onmousedown='grab({i},event)'></div>"
            for i, s in enumerate(spec["sliders"])
        )
        script = (
            f"const SL={js([[s['x'], s['y']] for s in spec['sliders']])},W={w},STEP={spec['step']};"
            f"S.values={js([s['start'] for s in spec['sliders']])};S.drag=null;"
            "function show(i){document.querySelector(`[data-key=h${i}]`).style.left="
            "(SL[i][0]+S.values[i]/100*W-12)+'px';"
            "document.getElementById('v'+i).textContent=S.values[i]}"
            "function setx(i,x){S.values[i]=Math.max(0,Math.min(100,Math.round((x-SL[i][0])/W*100/STEP)*STEP));show(i)}"
            "function grab(i,e){S.drag=i;setx(i,e.clientX);e.preventDefault()}"
            "document.addEventListener('mousemove',e=>{if(S.drag!==null)setx(S.drag,e.clientX)});"
            "document.addEventListener('mouseup',()=>{S.drag=null});S.values.forEach((_,i)=>show(i));"
        )
        return document("Slider", body, script)

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return f"S.values[{spec['target']}]", spec["value"]

    def _drag_to(self, spec: dict[str, Any], state: dict[str, Any], value: int) -> str:
        t = spec["target"]
        handle, track = state["els"][f"h{t}"], state["els"][f"s{t}"]
        start = Point(round(handle["x"] + handle["w"] / 2), round(handle["y"] + handle["h"] / 2))
        end = Point(round(track["x"] + value / 100 * track["w"]), round(track["y"] + track["h"] / 2))
        return drag(start, end)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if state["st"]["values"][spec["target"]] == spec["value"]:
            return finished(f"set to {spec['value']}")
        return self._drag_to(spec, state, spec["value"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return self._drag_to(spec, state, (spec["value"] + 30) % 100)


@register
class ScrollFind(BrowserFamily):
    name = "scroll-find"
    levels = (1, 2, 3)
    summary = "scroll a long list (30, 60 or 100 rows) to an item below the fold and click it"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n = {1: 30, 2: 60, 3: 100}[difficulty]
        numbers = rng.sample(range(100, 1000), n)
        items = [f"{rng.choice(WORDS)} {k}" for k in numbers]
        return {"items": items, "target": rng.randrange(16, n), "x": rng.randint(100, 700)}

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Scroll down the list to find '{spec['items'][spec['target']]}' and click it."

    def page(self, spec: dict[str, Any]) -> str:
        rows = "".join(
            f"<div data-key='l{i}' style='height:40px;line-height:40px;padding-left:14px;border-bottom:1px solid #ccc;"
            f"background:#fff' onclick='S.clicked={js(item)};status(\"Clicked \"+S.clicked)'>{esc(item)}</div>"
            for i, item in enumerate(spec["items"])
        )
        body = f"<div style='margin:40px 0 80px {spec['x']}px;width:420px'>{rows}</div>"
        return document("List", body, "S.clicked=null;")

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.clicked", spec["items"][spec["target"]]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished(f"clicked {spec['items'][spec['target']]}")
        row = state["els"][f"l{spec['target']}"]
        return click(row) if in_view(row, state) else scroll_towards(row, state)

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return click(state["els"]["l0"] if in_view(state["els"]["l0"], state) else state["els"]["l20"])


@register
class Form(BrowserFamily):
    name = "form"
    levels = (1, 2)
    summary = "fill two named fields of a form and submit it (level 2: two more fields stay empty)"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        fields = rng.sample(FIELDS, 2 * difficulty)
        targets = sorted(rng.sample(range(len(fields)), 2))
        values = [rng.choice(FIELD_VALUES[f]) if i in targets else "" for i, f in enumerate(fields)]
        return {
            "fields": fields,
            "values": values,
            "targets": targets,
            "pos": [rng.randint(80, 700), rng.randint(60, 260)],
        }

    def instruction(self, spec: dict[str, Any]) -> str:
        parts = [f"{spec['fields'][i]} '{spec['values'][i]}'" for i in spec["targets"]]
        return f"Fill in the form with {' and '.join(parts)}, then press Submit."

    def page(self, spec: dict[str, Any]) -> str:
        x, y = spec["pos"]
        rows = "".join(
            f"<div style='margin:10px 0'><span class='lbl' style='display:inline-block;width:110px'>{esc(f)}</span>"
            f"<input type='text' data-key='f{i}' autocomplete='off'></div>"
            for i, f in enumerate(spec["fields"])
        )
        body = (
            f"<form class='abs' style='left:{x}px;top:{y}px;padding:16px;background:#fff;border:1px solid #999'"
            f' onsubmit=\'event.preventDefault();S.submitted=[...this.querySelectorAll("input")].map(i=>i.value);'
            f"status(\"Submitted\")'>{rows}<button data-key='submit'>Submit</button></form>"
        )
        return document("Form", body, "S.submitted=null;")

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.submitted", spec["values"]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished("submitted")
        for i, wanted in enumerate(spec["values"]):
            action = fix_input(state["els"][f"f{i}"], wanted)
            if action:
                return action
        return click(state["els"]["submit"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return click(state["els"]["submit"])  # submits the form empty


@register
class Menu(BrowserFamily):
    name = "menu"
    levels = (1, 2)
    summary = "open a menu of the menu bar and choose an entry (level 2: the entry is in a submenu)"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        names = rng.sample(sorted(MENUS), 4)
        menus = [{"name": m, "entries": list(MENUS[m]), "sub": None} for m in names]
        target = rng.randrange(4)
        if difficulty == 2:
            sub = rng.choice(sorted(SUBMENUS))
            menus[target]["sub"] = {"name": sub, "entries": list(SUBMENUS[sub])}
            path = [menus[target]["name"], sub, rng.choice(SUBMENUS[sub])]
        else:
            path = [menus[target]["name"], rng.choice(MENUS[menus[target]["name"]])]
        return {"menus": menus, "target": target, "path": path, "left": rng.randint(0, 500)}

    def instruction(self, spec: dict[str, Any]) -> str:
        if len(spec["path"]) == 3:
            return f"In the {spec['path'][0]} menu, open {spec['path'][1]} and choose '{spec['path'][2]}'."
        return f"Open the {spec['path'][0]} menu and choose '{spec['path'][1]}'."

    def page(self, spec: dict[str, Any]) -> str:
        item = "height:38px;line-height:38px;padding:0 14px;white-space:nowrap"
        heads, lists = "", ""
        for m, menu in enumerate(spec["menus"]):
            heads += (
                f"<span data-key='m{m}' style='display:inline-block;{item}' onclick='openMenu({m})'>"
                f"{esc(menu['name'])}</span>"
            )
            entries = "".join(
                f"<div data-key='m{m}e{e}' style='{item}' onclick='choose({js([menu['name'], name])})'>"
                f"{esc(name)}</div>"
                for e, name in enumerate(menu["entries"])
            )
            if menu["sub"]:
                sub = menu["sub"]
                subs = "".join(
                    f"<div data-key='m{m}s{e}' style='{item}' onclick='choose({js([menu['name'], sub['name'], n])})'>"
                    f"{esc(n)}</div>"
                    for e, n in enumerate(sub["entries"])
                )
                entries += (
                    f"<div style='position:relative'><div data-key='m{m}sub' style='{item}' onclick='S.sub=true;"
                    f'document.getElementById("sub{m}").style.display="block"\'>{esc(sub["name"])} ▸</div>'
                    f"<div id='sub{m}' style='display:none;position:absolute;left:100%;top:0;background:#fff;"
                    f"border:1px solid #678;min-width:140px'>{subs}</div></div>"
                )
            lists += (
                f"<div id='menu{m}' class='abs' style='display:none;background:#fff;border:1px solid #678;"
                f"min-width:160px'>{entries}</div>"
            )
        body = (
            f"<div id='bar' style='background:#e4e4ea;border-bottom:1px solid #999;padding-left:{spec['left']}px'>"
            f"{heads}</div>"
            f"{lists}<p style='margin:200px 0 0 300px;color:#888'>Choose an entry from the menus above.</p>"
        )
        script = (
            "S.chosen=null;S.open=null;S.sub=false;"
            "function closeAll(){document.querySelectorAll('[id^=menu],[id^=sub]').forEach(l=>l.style.display='none');"
            "S.open=null;S.sub=false}"
            "function openMenu(m){const was=S.open;closeAll();if(was===m)return;"
            "const h=document.querySelector(`[data-key=m${m}]`)"
            ".getBoundingClientRect(),l=document.getElementById('menu'+m);l.style.left=h.left+'px';l.style.top=h.bottom+'px';"
            "l.style.display='block';S.open=m}"
            "function choose(p){S.chosen=p;closeAll();status('Chose '+p.join(' > '))}"
        )
        return document("Menus", body, script)

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.chosen", spec["path"]

    def _key(self, spec: dict[str, Any]) -> str:
        m, path = spec["target"], spec["path"]
        if len(path) == 3:
            return f"m{m}s{SUBMENUS[path[1]].index(path[2])}"
        return f"m{m}e{MENUS[path[0]].index(path[1])}"

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished("chose " + " > ".join(spec["path"]))
        m, els = spec["target"], state["els"]
        if els[self._key(spec)]["shown"]:
            return click(els[self._key(spec)])
        if len(spec["path"]) == 3 and els[f"m{m}sub"]["shown"]:
            return click(els[f"m{m}sub"])
        return click(els[f"m{m}"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        m, els = spec["target"], state["els"]
        entry = els[f"m{m}e0" if self._key(spec) != f"m{m}e0" else f"m{m}e1"]
        return click(entry) if entry["shown"] else click(els[f"m{m}"])


@register
class Tabs(BrowserFamily):
    name = "tabs"
    levels = (1, 2)
    summary = "switch to a named tab and click a button there; the same labels appear in the other tabs"

    TABS = ("General", "Display", "Sound", "Network", "Privacy", "Updates")

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        tabs = rng.sample(self.TABS, 2 + difficulty)
        labels = rng.sample(LABELS, 3 + difficulty)
        buttons = [rng.sample(labels, 3) for _ in tabs]
        target = rng.randrange(1, len(tabs))  # tab 0 is open at the start
        return {"tabs": tabs, "buttons": buttons, "target": target, "button": rng.randrange(3),
                "pos": [rng.randint(40, 600), rng.randint(60, 300)]}  # fmt: skip

    def _want(self, spec: dict[str, Any]) -> list[str]:
        return [spec["tabs"][spec["target"]], spec["buttons"][spec["target"]][spec["button"]]]

    def instruction(self, spec: dict[str, Any]) -> str:
        tab, label = self._want(spec)
        return f"In the {tab} tab, click '{label}'."

    def page(self, spec: dict[str, Any]) -> str:
        x, y = spec["pos"]
        heads = "".join(
            f"<span data-key='t{t}' class='btn' style='display:inline-block;margin-right:4px' onclick='show({t})'>"
            f"{esc(n)}</span>"
            for t, n in enumerate(spec["tabs"])
        )
        panels = "".join(
            f"<div id='p{t}' style='display:none;padding:24px'>"
            + "".join(
                f"<button data-key='t{t}b{b}' style='margin-right:12px' onclick='S.clicked=[{js(n)},{js(label)}];"
                f'status("Clicked "+S.clicked.join("/"))\'>{esc(label)}</button>'
                for b, label in enumerate(spec["buttons"][t])
            )
            + "</div>"
            for t, n in enumerate(spec["tabs"])
        )
        body = (
            f"<div class='abs' style='left:{x}px;top:{y}px;width:620px;background:#fff;border:1px solid #999'>"
            f"{heads}{panels}</div>"
        )
        script = (
            "S.clicked=null;S.tab=0;function show(t){S.tab=t;document.querySelectorAll('[id^=p]').forEach((p,i)=>"
            "p.style.display=i===t?'block':'none')}show(0);"
        )
        return document("Tabs", body, script)

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.clicked", self._want(spec)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished("clicked " + "/".join(self._want(spec)))
        t = spec["target"]
        if state["st"]["tab"] != t:
            return click(state["els"][f"t{t}"])
        return click(state["els"][f"t{t}b{spec['button']}"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        t = state["st"]["tab"] if state["st"]["tab"] != spec["target"] else 0
        return click(state["els"][f"t{t}b0"]) if state["st"]["tab"] == t else click(state["els"][f"t{t}"])
