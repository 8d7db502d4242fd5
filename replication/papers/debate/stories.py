"""The debate notebook's stories (Khan et al. 2024 use QuALITY; a 135M model on a CPU cannot read 7,000-token
stories): short generated stories at two levels, each with one question, its correct answer and a distractor of the
same kind, and the stored set in data/generated/ that the notebook reads."""
import numpy as np

from replication.core import config, files
from .params import LEVELS

STORIES_FILE = config.ROOT / "data" / "generated" / "debate_stories.json"
NAMES = ["Ines", "Tomas", "Priya", "Okafor", "Lena", "Rafael", "Mei", "Soren", "Adaeze", "Kofi", "Yara", "Bruno"]
PLACES = ["the blue lantern", "the cargo bay", "the greenhouse", "the captain's locker", "the broken radio",
          "the engine room", "the supply crate", "the observation dome", "the medical cabinet", "the old shuttle"]
OBJECTS = ["brass key", "star map", "fuel cell", "data crystal", "silver compass", "seed packet"]
MACHINES = ["water pump", "air filter", "heater", "long-range antenna", "airlock door"]
SHIPS = ["Vela", "Halcyon", "Meridian", "Kestrel", "Tamsin", "Orrery"]
MOONS = ["a cold moon", "a red dwarf", "the ice world Brin", "a silent gas giant"]
FILLER = ["The hull creaked in the cold.", "Nobody had slept well for a week.", "Outside, the dust glittered.",
          "The coffee had run out long ago.", "A warning light blinked and went dark."]




def make_story(rng, level: str = "absent") -> dict:
    """One story with a question, its correct answer and a distractor of the same kind. level "absent": about 50
    words of plain facts, the distractor nowhere in the story (reading it settles the question); "present":
    about 115 words, the distractor also in the story in a misleading role (a crew member who searched the
    wrong place, the storm length the radio promised)."""
    config.check_choice("level", level, LEVELS)
    a, b, c = map(str, rng.choice(NAMES, 3, replace=False))
    p1, p2 = map(str, rng.choice(PLACES, 2, replace=False))
    o1, o2 = map(str, rng.choice(OBJECTS, 2, replace=False))
    machine, ship, moon = str(rng.choice(MACHINES)), str(rng.choice(SHIPS)), str(rng.choice(MOONS))
    d1, d2 = map(int, rng.choice(np.arange(2, 10), 2, replace=False))
    f1, f2 = map(str, rng.choice(FILLER, 2, replace=False))
    if level == "absent":
        x = str(rng.choice([n for n in NAMES if n not in (a, b, c)]))
        p3 = str(rng.choice([p for p in PLACES if p not in (p1, p2)]))
        o3 = str(rng.choice([o for o in OBJECTS if o not in (o1, o2)]))
        lines = [f"The {ship} was stuck in a storm with a crew of three: {a}, {b} and {c}.",
                 f"The storm lasted {d1} days.", f"{a} hid the {o1} in {p1}.", f"{b} kept the {o2} in {p2}.",
                 f"{c} repaired the {machine}.", f1]
        questions = [(f"Where did {a} hide the {o1}?", f"in {p1}", f"in {p3}"),
                     (f"Who repaired the {machine}?", c, x),
                     (f"What did {a} hide in {p1}?", f"the {o1}", f"the {o3}"),
                     ("How many days did the storm last?", f"{d1} days", f"{d2} days"),
                     (f"Who hid the {o1}?", a, x)]
    else:
        lines = [f"The {ship} drifted above {moon} with a crew of three: {a}, {b} and {c}.",
                 f"The radio had promised a storm of {d2} days, but it lasted {d1} days.",
                 f"Before the storm, {a} hid the {o1} in {p1} and told no one.",
                 f"{b} was sure the {o1} was in {p2} and searched there all night, finding only dust.",
                 f"{b} kept the {o2} close the whole time.",
                 f"Later, {c} repaired the {machine} while {b} only held the lamp.",
                 f1,
                 f"When the storm ended, {a} opened {p1}, took out the {o1} and gave it to {c}.",
                 f2]
        questions = [(f"Where did {a} hide the {o1}?", f"in {p1}", f"in {p2}"),
                     (f"Who repaired the {machine}?", c, b),
                     (f"What did {a} hide in {p1}?", f"the {o1}", f"the {o2}"),
                     ("How many days did the storm last?", f"{d1} days", f"{d2} days"),
                     (f"Who hid the {o1}?", a, b)]
    q, correct, distractor = questions[rng.integers(len(questions))]
    return {"story": " ".join(lines), "question": q, "correct": correct, "distractor": distractor}


def make_stories(n: int, seed: int = 0, level: str = "absent") -> list:
    """n stories from one seed; each gets an id."""
    config.check_int("n", n)
    rng = np.random.default_rng(seed)
    return [{"id": f"{level[0]}{seed}-{k:04d}", **make_story(rng, level)} for k in range(n)]


def save_stories(n: int = 300, seed: int = 0, level: str = "absent", path=STORIES_FILE):
    """Write the stored dataset (with its seed, level and generator) to data/generated/."""
    return files.write_json(path, {"generator": "replication.papers.debate.stories.make_stories", "seed": seed, "level": level,
                                   "n": n, "stories": make_stories(n, seed, level)})


def load_stories(n: int, seed: int = 0, level: str = "absent", path=STORIES_FILE) -> list:
    """The first n stories: the stored ones, checked against the generator (raises if they differ), or freshly
    generated for another seed or level or a larger n."""
    stored = files.read_json(path)
    if seed != stored["seed"] or level != stored.get("level") or n > stored["n"]:
        return make_stories(n, seed, level)
    items = stored["stories"][:n]
    if items != make_stories(n, seed, level):
        raise ValueError(f"{path} no longer matches make_stories(seed={seed}); regenerate it with save_stories()")
    return items
