"""Word pools the families draw labels, values and distractors from."""

LABELS = (
    "Save", "Open", "Close", "Print", "Share", "Delete", "Rename", "Copy", "Paste", "Undo", "Redo", "Send", "Reply",
    "Archive", "Export", "Import", "Search", "Filter", "Sort", "Refresh", "Upload", "Download", "Edit", "Submit",
    "Cancel", "Apply", "Reset", "Help", "Login", "Logout", "Next", "Back", "Start", "Stop", "Pause", "Play", "Zoom",
    "Crop", "Rotate", "Merge", "Split", "Lock", "Unlock", "Pin", "Mute", "Star", "Flag", "Move",
)  # fmt: skip
WORDS = (
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket", "garden", "silver", "candle", "forest",
    "orange", "planet", "winter", "bridge", "copper", "dragon", "island", "marble", "meadow", "pepper", "rabbit",
    "sunset", "violet", "walnut", "yellow", "anchor", "banana", "castle", "falcon", "guitar", "harbor", "jungle",
    "kettle", "ladder", "mirror", "noodle", "pencil", "quartz", "saddle", "tunnel", "velvet", "window", "zipper",
)  # fmt: skip
CATEGORIES = {
    "fruit": ("apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum", "pear", "melon"),
    "animal": ("tiger", "horse", "rabbit", "eagle", "otter", "zebra", "camel", "wolf", "panda", "goat"),
    "colour": ("red", "blue", "green", "purple", "orange", "yellow", "black", "white", "pink", "brown"),
    "tool": ("hammer", "wrench", "saw", "drill", "chisel", "pliers", "shovel", "rake", "axe", "file"),
}
FIELDS = ("Name", "City", "Email", "Phone", "Company", "Country", "Street", "Title")
FIELD_VALUES = {
    "Name": ("Ada", "Linus", "Grace", "Alan", "Marie", "Nikola", "Rosa", "Tim"),
    "City": ("Paris", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Rome", "Tokyo"),
    "Email": ("ada@mail.org", "max@post.net", "kim@home.io", "lee@work.com", "sam@lab.edu"),
    "Phone": ("555-0101", "555-0142", "555-0199", "555-0123", "555-0177"),
    "Company": ("Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay"),
    "Country": ("Peru", "Chile", "Norway", "Egypt", "India", "Japan", "Italy"),
    "Street": ("Main St", "Oak Ave", "Elm Rd", "Pine Ln", "Lake Dr"),
    "Title": ("Dr", "Mr", "Ms", "Prof", "Sir"),
}
MENUS = {
    "File": ("New", "Open", "Save", "Save as", "Print", "Quit"),
    "Edit": ("Undo", "Redo", "Cut", "Copy", "Paste", "Find"),
    "View": ("Zoom in", "Zoom out", "Full screen", "Sidebar", "Ruler"),
    "Insert": ("Image", "Table", "Link", "Chart", "Symbol"),
    "Tools": ("Spelling", "Word count", "Macros", "Options"),
}
SUBMENUS = {
    "Format": ("Bold", "Italic", "Underline"),
    "Align": ("Left", "Center", "Right"),
    "Export": ("PDF", "HTML", "Text"),
}
FILES = (
    "report.txt", "notes.md", "budget.xls", "photo.png", "slides.odp", "todo.txt", "letter.doc", "song.mp3",
    "data.csv", "movie.mp4", "draft.txt", "plan.pdf", "logo.svg", "invoice.pdf", "backup.zip", "readme.md",
)  # fmt: skip
