"""What ``ssacli report`` measures on a language model when the user gives no data of their own.

* :func:`builtin_text`: the built-in probe texts of ``diagnose`` (ssacli.diagnosis.texts), joined by
  blank lines: the perplexity every report shows. They are ~12 k characters of varied original
  prose (science, recipe, fiction, news, manual, dialogue, legal, code comment, …), so the number
  says whether the model still models English, not how it does on its own training data
  (``--text-id`` / ``--heldout-of`` say that).
* :data:`BUILTIN_PAIRS`: 40 minimal pairs written for ssacli (no copied corpus), BLiMP-style
  records in three groups of English agreement: subject–verb (also across a prepositional phrase
  or a relative clause), determiner–noun, and reflexive pronoun–antecedent. Each bad sentence
  differs from its good one in one word. 40 pairs resolve accuracy to 2.5 points; a real model
  scores well above the 0.5 of chance, a broken one falls towards it.
"""

from __future__ import annotations

BUILTIN_TEXTS_NAME = "builtin:texts"
BUILTIN_PAIRS_NAME = "builtin:agreement"


def builtin_text() -> str:
    """The built-in probe texts as one document (blank line between texts)."""
    from ..diagnosis.texts import TEXTS

    return "\n\n".join(TEXTS)


def _pairs(rows: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"sentence_good": good, "sentence_bad": bad} for good, bad in rows]


BUILTIN_PAIRS: dict[str, list[dict[str, str]]] = {
    "subject_verb_agreement": _pairs(
        [
            ("The dog barks at the mailman every morning.", "The dog bark at the mailman every morning."),
            (
                "The children play in the garden after school.",
                "The children plays in the garden after school.",
            ),
            ("My sister lives in a small town by the sea.", "My sister live in a small town by the sea."),
            (
                "These apples taste sweeter than the ones we bought last week.",
                "These apples tastes sweeter than the ones we bought last week.",
            ),
            ("The teacher was happy with the results.", "The teacher were happy with the results."),
            ("The students were late for the first lesson.", "The students was late for the first lesson."),
            (
                "The keys to the cabinet are on the kitchen table.",
                "The keys to the cabinet is on the kitchen table.",
            ),
            ("The box of old letters is in the attic.", "The box of old letters are in the attic."),
            ("The painting above the beds looks expensive.", "The painting above the beds look expensive."),
            (
                "The cars in the parking lot belong to the staff.",
                "The cars in the parking lot belongs to the staff.",
            ),
            (
                "The woman who sold us the tickets has left the station.",
                "The woman who sold us the tickets have left the station.",
            ),
            (
                "The farmers who grow these grapes sell them at the market.",
                "The farmers who grow these grapes sells them at the market.",
            ),
            (
                "The book that the professors recommended is out of print.",
                "The book that the professors recommended are out of print.",
            ),
            (
                "The bridges that the engineer designed carry heavy traffic.",
                "The bridges that the engineer designed carries heavy traffic.",
            ),
            ("Every player on both teams knows the rules.", "Every player on both teams know the rules."),
            ("Neither of the answers seems correct to me.", "Neither of the answers seem correct to me."),
        ]
    ),
    "determiner_noun_agreement": _pairs(
        [
            ("Carla bought this dress for the wedding.", "Carla bought this dresses for the wedding."),
            ("We planted these trees three years ago.", "We planted these tree three years ago."),
            ("That house on the hill has a red roof.", "That houses on the hill has a red roof."),
            ("Those birds fly south every winter.", "Those bird fly south every winter."),
            ("He has read this book twice already.", "He has read this books twice already."),
            (
                "She washed these cups before the guests arrived.",
                "She washed these cup before the guests arrived.",
            ),
            ("I have never seen that movie before.", "I have never seen that movies before."),
            ("The baker sold those cakes by noon.", "The baker sold those cake by noon."),
            ("A single candle lit the whole room.", "A single candles lit the whole room."),
            ("Many people came to the concert in the park.", "Many person came to the concert in the park."),
            ("Each student received a certificate.", "Each students received a certificate."),
            ("Several boxes were damaged during the move.", "Several box were damaged during the move."),
        ]
    ),
    "anaphor_agreement": _pairs(
        [
            (
                "The boy hurt himself while climbing the fence.",
                "The boy hurt herself while climbing the fence.",
            ),
            ("The girl taught herself to play the guitar.", "The girl taught himself to play the guitar."),
            (
                "The doctors trusted themselves to make the right call.",
                "The doctors trusted himself to make the right call.",
            ),
            ("My brother cut himself on a broken glass.", "My brother cut herself on a broken glass."),
            (
                "The queen described herself as a patient ruler.",
                "The queen described himself as a patient ruler.",
            ),
            ("The students prepared themselves for the exam.", "The students prepared herself for the exam."),
            ("The old man talked to himself on the bus.", "The old man talked to themselves on the bus."),
            ("The actress saw herself on the big screen.", "The actress saw himself on the big screen."),
            (
                "The workers protected themselves from the heat.",
                "The workers protected itself from the heat.",
            ),
            ("The cat cleaned itself in the sun.", "The cat cleaned themselves in the sun."),
            (
                "The king crowned himself in front of the court.",
                "The king crowned herself in front of the court.",
            ),
            (
                "The nurses introduced themselves to the new patient.",
                "The nurses introduced himself to the new patient.",
            ),
        ]
    ),
}

__all__ = ["BUILTIN_PAIRS", "BUILTIN_PAIRS_NAME", "BUILTIN_TEXTS_NAME", "builtin_text"]
