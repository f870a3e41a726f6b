"""Single-page browser families of one or a few clicks: buttons, text fields, check boxes, radio buttons, file icons
and a search box. Each page keeps its own state in window.__suite (S); the verifier reads it."""

from __future__ import annotations

import random
from typing import Any

from .core import Family, register
from .page import (
    click,
    data_url,
    document,
    double_click,
    esc,
    finished,
    fix_input,
    hotkey,
    js,
    place,
    type_text,
    verifier,
)
from .words import CATEGORIES, FIELDS, FILES, LABELS, WORDS

AREA = (40, 60, 1200, 660)  # where widgets go: clear of the top edge and the status bar


class BrowserFamily(Family):
    """A family played on one local page (data: URL) and verified by a JavaScript expression over its state."""

    platform = "browser"
    app = "chromium"

    def page(self, spec: dict[str, Any]) -> str:
        raise NotImplementedError

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        """The verifier's expression over the page's state, and the value it must have."""
        raise NotImplementedError

    def setup(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [data_url(self.page(spec))]}}]

    def evaluator(self, spec: dict[str, Any]) -> dict[str, Any]:
        return verifier(*self.check(spec))

    def done(self, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        """Whether the page's state already satisfies the verifier (the oracle then says finished)."""
        expression, expected = self.check(spec)
        key = expression.removeprefix("S.").split(" ")[0]
        return (state.get("st") or {}).get(key) == expected


def _other(rng: random.Random, pool: tuple[str, ...], avoid: str) -> str:
    return rng.choice([w for w in pool if w != avoid])


@register
class ClickButton(BrowserFamily):
    name = "click-button"
    levels = (1, 2, 3)
    summary = "click the button with a given label among distractors (3, 6 or 10 buttons)"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n = {1: 3, 2: 6, 3: 10}[difficulty]
        return {"labels": rng.sample(LABELS, n), "target": rng.randrange(n), "pos": place(rng, n, 150, 50, AREA)}

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Click the button labelled '{spec['labels'][spec['target']]}'."

    def page(self, spec: dict[str, Any]) -> str:
        body = "".join(
            f"<button class='abs' data-key='b{i}' style='left:{x}px;top:{y}px;width:150px'"
            f" onclick='S.clicked={js(label)};status(\"Clicked \"+S.clicked)'>{esc(label)}</button>"
            for i, (label, (x, y)) in enumerate(zip(spec["labels"], spec["pos"], strict=True))
        )
        return document("Buttons", body, "S.clicked=null;")

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.clicked", spec["labels"][spec["target"]]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished(f"clicked {spec['labels'][spec['target']]}")
        return click(state["els"][f"b{spec['target']}"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return click(state["els"][f"b{(spec['target'] + 1) % len(spec['labels'])}"])


@register
class TypeField(BrowserFamily):
    name = "type-field"
    levels = (1, 2, 3)
    summary = "type a word into the named field (1 or 3 fields; at level 3 the field holds a wrong word to replace)"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n = 1 if difficulty == 1 else 3
        fields = rng.sample(FIELDS, n)
        target = rng.randrange(n)
        word = rng.choice(WORDS)
        prefill = [""] * n
        if difficulty == 3:
            prefill[target] = _other(rng, WORDS, word)
        return {"fields": fields, "target": target, "word": word, "prefill": prefill,
                "pos": place(rng, n, 420, 50, AREA)}  # fmt: skip

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Type '{spec['word']}' into the {spec['fields'][spec['target']]} field."

    def page(self, spec: dict[str, Any]) -> str:
        body = "".join(
            f"<div class='abs' style='left:{x}px;top:{y}px'><span class='lbl'>{esc(name)}</span>"
            f"<input type='text' data-key='f{i}' value='{esc(pre)}' autocomplete='off'></div>"
            for i, (name, pre, (x, y)) in enumerate(zip(spec["fields"], spec["prefill"], spec["pos"], strict=True))
        )
        return document("Fields", body, "")

    def expected(self, spec: dict[str, Any]) -> list[str]:
        values = list(spec["prefill"])
        values[spec["target"]] = spec["word"]
        return values

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        expression = (
            f"[...Array({len(spec['fields'])}).keys()].map(i => document.querySelector(`[data-key=f${{i}}]`).value)"
        )
        return expression, self.expected(spec)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        for i, wanted in enumerate(self.expected(spec)):
            action = fix_input(state["els"][f"f{i}"], wanted)
            if action:
                return action
        return finished(f"typed {spec['word']}")

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        box = state["els"][f"f{spec['target']}"]
        return type_text(spec["word"][::-1] + "x") if box["focus"] else click(box)


@register
class Checkboxes(BrowserFamily):
    name = "checkboxes"
    levels = (1, 2, 3)
    summary = "tick exactly the boxes that match: one named, two named (one wrong box pre-ticked), or a category"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        category = rng.choice(sorted(CATEGORIES))
        others = [w for c, ws in CATEGORIES.items() if c != category for w in ws]
        n, k = {1: (4, 1), 2: (6, 2), 3: (8, 3)}[difficulty]
        items = rng.sample(CATEGORIES[category], k) + rng.sample(others, n - k)
        rng.shuffle(items)
        targets = sorted(i for i, w in enumerate(items) if w in CATEGORIES[category])
        pre = [False] * n
        if difficulty == 2:
            pre[rng.choice([i for i in range(n) if i not in targets])] = True
        return {"items": items, "targets": targets, "category": category, "pre": pre,
                "level": difficulty, "pos": place(rng, n, 200, 44, AREA)}  # fmt: skip

    def instruction(self, spec: dict[str, Any]) -> str:
        if spec["level"] == 3:
            return f"Tick every box that names a {spec['category']}, and no other box."
        names = " and ".join(f"'{spec['items'][i]}'" for i in spec["targets"])
        return f"Tick the box{'es' if len(spec['targets']) > 1 else ''} labelled {names}, and no other box."

    def page(self, spec: dict[str, Any]) -> str:
        body = "".join(
            f"<label class='abs' data-key='c{i}' style='left:{x}px;top:{y}px;width:180px;padding:8px;"
            f"background:#fff;border:1px solid #999;border-radius:4px'><input type='checkbox'"
            f" style='transform:scale(1.6);margin:0 14px 0 6px'{' checked' if pre else ''}"
            f" onchange='S.checked[{i}]=this.checked'>{esc(item)}</label>"
            for i, (item, pre, (x, y)) in enumerate(zip(spec["items"], spec["pre"], spec["pos"], strict=True))
        )
        return document("Check boxes", body, f"S.checked={js(spec['pre'])};")

    def expected(self, spec: dict[str, Any]) -> list[bool]:
        return [i in spec["targets"] for i in range(len(spec["items"]))]

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.checked", self.expected(spec)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        for i, (now, wanted) in enumerate(zip(state["st"]["checked"], self.expected(spec), strict=True)):
            if now != wanted:
                return click(state["els"][f"c{i}"])
        return finished("ticked")

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        wrong = [i for i in range(len(spec["items"])) if i not in spec["targets"] and not state["st"]["checked"][i]]
        return click(state["els"][f"c{(wrong or spec['targets'])[0]}"])


@register
class Radio(BrowserFamily):
    name = "radio"
    levels = (1, 2)
    summary = "choose an option in one radio group, or one in each of two groups"

    GROUPS = {
        "Shipping": ("Standard", "Express", "Overnight", "Pickup"),
        "Payment": ("Card", "Cash", "Transfer", "Voucher"),
        "Size": ("Small", "Medium", "Large", "Huge"),
        "Colour": ("Red", "Green", "Blue", "Grey"),
    }

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        names = rng.sample(sorted(self.GROUPS), difficulty)
        groups = [{"name": g, "options": rng.sample(self.GROUPS[g], 4)} for g in names]
        return {"groups": groups, "targets": [rng.randrange(4) for _ in groups],
                "pos": place(rng, len(groups), 300, 240, AREA)}  # fmt: skip

    def instruction(self, spec: dict[str, Any]) -> str:
        parts = [f"'{g['options'][t]}' for {g['name']}" for g, t in zip(spec["groups"], spec["targets"], strict=True)]
        return "Choose " + " and ".join(parts) + "."

    def page(self, spec: dict[str, Any]) -> str:
        body = ""
        for g, (group, (x, y)) in enumerate(zip(spec["groups"], spec["pos"], strict=True)):
            rows = "".join(
                f"<label data-key='r{g}o{o}' style='display:block;padding:8px;margin:4px 0;background:#fff;"
                f"border:1px solid #aaa'><input type='radio' name='g{g}' style='transform:scale(1.5);margin-right:12px'"
                f" onchange='S.choice[{g}]={js(option)}'>{esc(option)}</label>"
                for o, option in enumerate(group["options"])
            )
            body += f"<fieldset class='abs' style='left:{x}px;top:{y}px;width:240px'><legend>{esc(group['name'])}"
            body += f"</legend>{rows}</fieldset>"
        return document("Options", body, f"S.choice={js([None] * len(spec['groups']))};")

    def expected(self, spec: dict[str, Any]) -> list[str]:
        return [g["options"][t] for g, t in zip(spec["groups"], spec["targets"], strict=True)]

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.choice", self.expected(spec)

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        for g, (now, wanted) in enumerate(zip(state["st"]["choice"], self.expected(spec), strict=True)):
            if now != wanted:
                return click(state["els"][f"r{g}o{spec['targets'][g]}"])
        return finished("chosen")

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return click(state["els"][f"r0o{(spec['targets'][0] + 1) % 4}"])


@register
class OpenFile(BrowserFamily):
    name = "open-file"
    levels = (1, 2)
    summary = "double-click a file icon to open it (a single click only selects); 6 or 12 files"

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        n = 6 * difficulty
        return {"files": rng.sample(FILES, n), "target": rng.randrange(n), "pos": place(rng, n, 130, 90, AREA)}

    def instruction(self, spec: dict[str, Any]) -> str:
        return f"Open the file '{spec['files'][spec['target']]}' by double-clicking it."

    def page(self, spec: dict[str, Any]) -> str:
        body = "".join(
            f"<div class='abs' data-key='i{i}' style='left:{x}px;top:{y}px;width:130px;height:90px;text-align:center'"
            f" onclick='status(\"Selected \"+{js(name)})'"
            f" ondblclick='S.opened={js(name)};status(\"Opened \"+S.opened)'>"
            f"<div style='margin:0 auto;width:44px;height:54px;background:#9ab;border:2px solid #567'></div>"
            f"{esc(name)}</div>"
            for i, (name, (x, y)) in enumerate(zip(spec["files"], spec["pos"], strict=True))
        )
        return document("Files", body, "S.opened=null;")

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.opened", spec["files"][spec["target"]]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished(f"opened {spec['files'][spec['target']]}")
        return double_click(state["els"][f"i{spec['target']}"])

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        return click(state["els"][f"i{spec['target']}"])  # one click selects, it doesn't open


@register
class Search(BrowserFamily):
    name = "search"
    levels = (1, 2)
    summary = "type a query into the search box and press Enter (level 2: the right one of two boxes)"

    BOXES = ("Search people", "Search files", "Search mail", "Search music")

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        boxes = rng.sample(self.BOXES, difficulty)
        return {"boxes": boxes, "target": rng.randrange(difficulty), "word": rng.choice(WORDS),
                "pos": place(rng, difficulty, 480, 50, AREA)}  # fmt: skip

    def instruction(self, spec: dict[str, Any]) -> str:
        where = f" in the '{spec['boxes'][spec['target']]}' box" if len(spec["boxes"]) > 1 else ""
        return f"Search for '{spec['word']}'{where} (press Enter to search)."

    def page(self, spec: dict[str, Any]) -> str:
        body = "".join(
            f"<div class='abs' style='left:{x}px;top:{y}px'><input type='text' data-key='q{i}' placeholder='{esc(b)}'"
            f" autocomplete='off' onkeydown='if(event.key===\"Enter\"){{S.searched=[{js(b)},this.value];"
            f'status("Searched "+this.value)}}\'></div>'
            for i, (b, (x, y)) in enumerate(zip(spec["boxes"], spec["pos"], strict=True))
        )
        return document("Search", body, "S.searched=null;")

    def check(self, spec: dict[str, Any]) -> tuple[str, Any]:
        return "S.searched", [spec["boxes"][spec["target"]], spec["word"]]

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        if self.done(spec, state):
            return finished(f"searched {spec['word']}")
        box = state["els"][f"q{spec['target']}"]
        if box["focus"] and not box["value"]:
            return type_text(spec["word"] + "\n")
        return fix_input(box, spec["word"]) or hotkey("enter")

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        box = state["els"][f"q{spec['target']}"]
        return type_text(spec["word"] + "s\n") if box["focus"] else click(box)
