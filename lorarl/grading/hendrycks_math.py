"""Evalchemy's math grader: the hendrycks-MATH answer extraction and ``is_equiv`` string comparison.

Ported line for line from lm-evaluation-harness, ``lm_eval/tasks/hendrycks_math/utils.py`` (MIT licence;
EleutherAI; the functions Evalchemy imports read the same on its ``main`` and on the ``etashg/tokenize_fix`` branch
of EtashGuha's fork that Evalchemy pins in its ``pyproject.toml``: the two files differ only in ``process_results``,
which Evalchemy does not call), as Evalchemy's ``eval/chat_benchmarks/{AIME24,AIME25,AMC23,MATH500}/
eval_instruct.py`` call it:

* the answer is ``remove_boxed(last_boxed_only_string(output))``; any exception (no ``\\boxed``, an unclosed
  brace) gives the empty string (``extract_answer``'s bare ``except``);
* correct iff ``is_equiv(str(gold), answer)``: both strings normalised by :func:`strip_string` (line breaks,
  ``\\!``, ``\\left``/``\\right``, degrees, ``\\$``, a right unit after ``\\text{ ``, ``\\%``, a leading ``.``,
  a short ``k =`` prefix, ``\\sqrt3``, spaces, ``\\frac12``, ``0.5``, ``a/b``) and compared as text; when the
  normalisation raises (``fix_a_slash_b`` on ``x/2``, ``fix_sqrt`` on a trailing ``\\sqrt``, two
  ``\\text{ `` units) the raw strings are compared.

No symbolic comparison: ``\\frac{1}{2}`` equals ``0.5`` (a special case), ``1/2`` and ``\\dfrac12``, but not
``\\frac{2}{4}`` or ``.50``, and ``2.0`` is not ``2``; ``x = 5`` equals ``5`` (a prefix of at most two characters
before one ``=`` goes), ``10^\\circ`` equals ``10``. A ``\\boxed `` (with a space) anywhere in the output takes the
text after its last occurrence up to the next ``$``. Pure string code: no worker, no sympy.
"""

from __future__ import annotations

__all__ = ["is_equiv", "strip_string", "last_boxed_only_string", "remove_boxed", "evalchemy_answer", "hendrycks_boxed"]


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """lm-evaluation-harness's ``is_equiv`` (its ``verbose`` printing left out)."""
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        return strip_string(str1) == strip_string(str2)
    except Exception:  # noqa: BLE001 - as upstream: a normalisation that raises compares the raw strings
        return str1 == str2


def remove_boxed(s: str) -> str:
    """``\\boxed{x}`` -> ``x``; ``\\boxed x`` -> ``x``; anything else raises (AssertionError, TypeError on None)."""
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[: len(left)] == left
        return s[len(left):]
    left = "\\boxed{"
    assert s[: len(left)] == left
    assert s[-1] == "}"
    return s[len(left): -1]


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1
    return None if right_brace_idx is None else string[idx: right_brace_idx + 1]


def _fix_fracs(string: str) -> str:
    substrs = string.split("\\frac")
    new_str = substrs[0]
    if len(substrs) > 1:
        for substr in substrs[1:]:
            new_str += "\\frac"
            if substr[0] == "{":  # IndexError on a bare trailing \frac: is_equiv compares the raw strings
                new_str += substr
            else:
                if len(substr) < 2:
                    return string
                a, b = substr[0], substr[1]
                if b != "{":
                    new_str += "{" + a + "}{" + b + "}" + substr[2:]
                else:
                    new_str += "{" + a + "}" + b + substr[2:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        a_int, b_int = int(a), int(b)  # ValueError (x/2) propagates: is_equiv compares the raw strings
        assert string == "{}/{}".format(a_int, b_int)
        return "\\frac{" + str(a_int) + "}{" + str(b_int) + "}"
    except AssertionError:
        return string


def _remove_right_units(string: str) -> str:
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2  # two units raise: is_equiv compares the raw strings
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split[0] != "{":  # IndexError on a trailing \sqrt, as upstream
            new_string += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            new_string += "\\sqrt" + split
    return new_string


def strip_string(string: str) -> str:
    """lm-evaluation-harness's hendrycks-MATH normal form (the steps in upstream's order)."""
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    string = string.replace("\\%", "")  # upstream's second line reads "\%", the same two characters
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def evalchemy_answer(output: str) -> str:
    """Evalchemy's ``extract_answer``: the last boxed content, or ``""`` when there is none."""
    try:
        return remove_boxed(last_boxed_only_string(output))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - as Evalchemy's bare except: no box (None), an unbalanced box
        return ""


def hendrycks_boxed(completion: str, gold: str) -> tuple[bool, str | None]:
    """Evalchemy's verdict: ``(is_equiv(gold, answer), the answer or None when no box was read)``."""
    answer = evalchemy_answer(completion)
    return is_equiv(str(gold), answer), (answer if last_boxed_only_string(completion) is not None else None)
