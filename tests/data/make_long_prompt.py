"""A deterministic long prompt (about 1,500 SmolLM2 tokens) built from varied sentences."""

from __future__ import annotations

_SUBJECTS = ["The harbor master", "A quiet librarian", "The night baker", "Our old neighbor",
             "The train conductor", "A young botanist", "The city council", "An orchard keeper"]
_VERBS = ["counted", "repaired", "painted", "described", "measured", "carried", "planted", "sorted"]
_OBJECTS = ["seventeen copper lanterns", "the broken north bridge", "a map of the river delta",
            "three crates of winter apples", "the clock above the station", "a row of pear trees",
            "the letters from the lighthouse", "every blue stone on the beach"]
_TAILS = ["before the first snow arrived.", "while the fog rolled over the hills.",
          "because the festival was only a week away.", "and nobody asked why.",
          "as the bells rang across the valley.", "with surprising patience.",
          "although the rain never stopped.", "so that the children could watch."]


def long_prompt(num_sentences: int = 100) -> str:
    """Sentence i combines the four lists with different strides, so no short cycle repeats."""
    out = []
    for i in range(num_sentences):
        out.append(
            f"{_SUBJECTS[i % 8]} {_VERBS[(i * 3) % 8]} {_OBJECTS[(i * 5 + i // 8) % 8]} "
            f"{_TAILS[(i * 7 + i // 3) % 8]}"
        )
    return "Read the chronicle and summarize it.\n\n" + " ".join(out) + "\n\nSummary:"
