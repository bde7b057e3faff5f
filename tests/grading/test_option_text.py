"""An answer span holding the option's text instead of its letter (paper 000's GPQA, a policy trained to put the
answer itself in ``<answer>``): one table of cases through the letter grader, which reads option text only inside
an answer span and only against exactly one choice."""

from __future__ import annotations

import pytest

from lorarl.grading.choice import score_choice
from lorarl.grading.option_text import normal_text, numeric, option_letter

PARTICLES = ("Higgs boson", "photon", "gluon", "electron")      # GPQA's example row as its prompt lists it (D)
ENERGIES = ("1.2 eV", "2.50 eV", "$3.1\\ \\mathrm{eV}$", "0.4 eV")
SAME_VALUE = ("2.5 eV", "2.5 meV", "7 eV", "9 eV")
SCIENTIFIC = ("2.5 \\times 10^{-3} m", "4 \\times 10^{-3} m", "1,000 m", "12 m")
TWINS = ("Electron", "electron.", "photon", "gluon")           # two options alike once normalised


def tag(text: str) -> str:
    return f"<reasoning>\nworking\n</reasoning>\n<answer>\n{text}\n</answer>\n"


CASES = [  # (completion, choices, answer format, letter read)
    (tag("electron"), PARTICLES, "xml_answer", "D"),                    # the option's text
    ("<answer>electron</answer>", PARTICLES, "xml_answer", "D"),
    (tag("Electron."), PARTICLES, "xml_answer", "D"),                  # case, a full stop
    (tag("**electron**"), PARTICLES, "xml_answer", "D"),              # markdown
    (tag("$\\text{Higgs  boson}$"), PARTICLES, "xml_answer", "A"),     # math mode, \text{}, spacing
    (tag("D) electron"), PARTICLES, "xml_answer", "D"),               # the option text with its letter
    (tag("(D) electron"), PARTICLES, "xml_math", "D"),
    (tag("B) electron"), PARTICLES, "xml_answer", "B"),               # a letter is read first, as before
    (tag("The answer is electron."), PARTICLES, "xml_answer", "D"),   # after "The answer is" / "Answer:"
    (tag("Answer: 2.5 eV"), ENERGIES, "xml_answer", "B"),
    (tag("The answer is positron."), PARTICLES, "xml_answer", None),
    (tag("positron"), PARTICLES, "xml_answer", None),                 # matches no choice
    (tag("an electron"), PARTICLES, "xml_answer", None),
    (tag("electron"), TWINS, "xml_answer", None),                      # matches two choices: no answer
    (tag("2.5"), ENERGIES, "xml_answer", "B"),                         # numeric: 2.5 is 2.50 eV
    (tag("2.5 eV"), ENERGIES, "xml_answer", "B"),
    (tag("$2.50\\,\\mathrm{eV}$"), ENERGIES, "xml_answer", "B"),
    (tag("3.10 eV"), ENERGIES, "xml_answer", "C"),
    (tag("2.5 meV"), ENERGIES, "xml_answer", None),                    # another unit
    (tag("2.6 eV"), ENERGIES, "xml_answer", None),
    (tag("2.5"), SAME_VALUE, "xml_answer", None),                       # one value, two units: ambiguous
    (tag("2.5 meV"), SAME_VALUE, "xml_answer", "B"),
    (tag("0.0025 m"), SCIENTIFIC, "xml_answer", "A"),
    (tag("2.5e-3 m"), SCIENTIFIC, "xml_answer", "A"),
    (tag("1000 m"), SCIENTIFIC, "xml_answer", "C"),
    (tag("electron"), None, "xml_answer", None),                        # no choices (a record from before): letters
    (tag("electron"), PARTICLES, "boxed", None),                        # a boxed-letter study: unchanged
    ("\\boxed{electron}", PARTICLES, "boxed", None),
    ("<answer>electron</answer> so \\boxed{D}", PARTICLES, "boxed", "D"),
    (tag("photon") + " The answer is D", PARTICLES, "xml_answer", "B"),  # the span's text, not the later prose
]


@pytest.mark.parametrize("completion,choices,fmt,letter", CASES)
def test_option_text_in_the_answer_span(completion, choices, fmt, letter):
    for gold in "ABCD":
        s = score_choice(gold, completion, "ABCD", fmt, choices)
        assert (s.extracted, s.correct) == (letter, gold == letter)


def test_normal_forms():
    assert normal_text("  $\\text{Higgs}\\ boson$. ") == normal_text("higgs boson") == "higgsboson"
    assert numeric(normal_text("1,000 m")) == numeric(normal_text("1e3m"))
    assert numeric(normal_text("1,2")) is None and numeric("electron") is None   # "1,2" is no thousands number
    assert option_letter("  ", PARTICLES, "ABCD") is None
    assert option_letter("gluon", PARTICLES[:2], "ABCD") is None        # only the listed choices
