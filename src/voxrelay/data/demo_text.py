"""The demo corpus's sentences: a small grammar and word lists of voxrelay's own (no text is
copied from anywhere), 4-14 words, numbers spelled out, statements and questions."""

from __future__ import annotations

import numpy as np

# --- sentence grammar: our own word lists; every noun takes a regular plural ---------------------
_NAMES = "Mara Tobias Ines Oskar Lena Felix Nadia Arlo Wren Jonah Priya Emil".split()
_PEOPLE = """baker pilot captain gardener teacher fisherman painter doctor neighbour farmer
librarian tailor""".split()
_NOUNS = """lantern bicycle ladder kettle window letter violin basket blanket ticket mirror engine
candle notebook bridge teapot umbrella pebble scarf map bucket drum jacket wagon""".split()
_ADJECTIVES = """quiet yellow heavy narrow cheerful broken ancient tiny crooked gentle muddy silver
sleepy bright dusty clever curious stubborn wooden frozen""".split()
# (past, base) forms of transitive verbs
_VERBS = [("painted", "paint"), ("carried", "carry"), ("repaired", "repair"), ("found", "find"),
          ("borrowed", "borrow"), ("dropped", "drop"), ("cleaned", "clean"), ("measured", "measure"),
          ("opened", "open"), ("wrapped", "wrap"), ("counted", "count"), ("hid", "hide"),
          ("sold", "sell"), ("polished", "polish"), ("lifted", "lift"), ("forgot", "forget")]  # fmt: skip
_INTRANSITIVE = "laughed waited whistled wandered slept sang shivered hurried paused danced".split()
_ADVERBS = "slowly carefully quickly proudly quietly suddenly happily nervously".split()
_PLACES = ["near the station", "behind the library", "at the market", "under the bridge",
           "beside the lake", "in the kitchen", "on the roof", "across the valley",
           "inside the museum", "along the coast"]  # fmt: skip
_TIMES = ["this morning", "last winter", "before dinner", "after midnight", "on Tuesday",
          "every evening", "at dawn", "yesterday", "in April", "during the storm"]  # fmt: skip
_TEMPLATES = [
    "{subj} {past} the {adj} {noun} {place}.",
    "{subj} {past} {num} {adj} {nouns} {time}.",
    "Did {subj} {base} the {noun} {place}?",
    "Why did {subj} {base} the {adj} {noun} {time}?",
    "{Time}, {subj} {intr} {adv} {place}.",
    "Where is the {adj} {noun} that {subj} {past}?",
    "The {noun} was {adj}, so {subj} {intr}.",
    "How many {nouns} did {subj} {base} {time}?",
    "{subj} said the {noun} costs {num} coins.",
    "{subj} and {subj2} {past} the {noun}.",
]
_ONES = """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen""".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spell_number(n: int) -> str:
    """0 <= n < 1000 in English words, e.g. 342 -> 'three hundred and forty two'."""
    if not 0 <= n < 1000:
        raise ValueError(f"spell_number handles 0..999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    rest = n % 100
    return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + spell_number(rest))


class SentenceMaker:
    """Random sentences of 4-14 words from the grammar above, driven by a numpy Generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def _pick(self, items: list):
        return items[int(self.rng.integers(len(items)))]

    def _subject(self) -> str:
        if self.rng.random() < 0.5:
            return self._pick(_NAMES)
        adj = self._pick(_ADJECTIVES) + " " if self.rng.random() < 0.3 else ""
        return f"the {adj}{self._pick(_PEOPLE)}"

    def sentence(self) -> str:
        while True:
            past, base = self._pick(_VERBS)
            noun = self._pick(_NOUNS)
            n = int(self.rng.integers(2, 1000)) if self.rng.random() < 0.4 else int(self.rng.integers(2, 20))
            words = {
                "subj": self._subject(), "subj2": self._subject(), "past": past, "base": base,
                "noun": noun, "nouns": noun + "s", "adj": self._pick(_ADJECTIVES), "num": spell_number(n),
                "place": self._pick(_PLACES), "time": self._pick(_TIMES), "Time": self._pick(_TIMES),
                "intr": self._pick(_INTRANSITIVE), "adv": self._pick(_ADVERBS),
            }  # fmt: skip
            text = self._pick(_TEMPLATES).format(**words)
            if 4 <= len(text.split()) <= 14:
                return text[0].upper() + text[1:]
