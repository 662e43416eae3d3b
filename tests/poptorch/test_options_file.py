"""`Options.loadFromFile` refuses a bad line with one clear `ValueError`: the file, the line, the setter
and the value (a bounded prefix of it), a suggestion for a misspelt name, and never a raw Python exception.

The setters' own rules are the reference: a value refused by `opts.deviceIterations(0)` in a script is
refused on a line of a file, with the setter's message (`set(...)` included), and a line that parses is
applied exactly as the same call in a script would be.
"""

from __future__ import annotations

import re

import pytest

import poptorch


def _load(tmp_path, text: str | bytes) -> poptorch.Options:
    conf = tmp_path / "poptorch.conf"
    conf.write_bytes(text if isinstance(text, bytes) else text.encode())
    return poptorch.Options().loadFromFile(str(conf))


def _refused(tmp_path, text: str | bytes, line: int = 1) -> str:
    """The message of the `ValueError` the file is refused with; it names the file and the line."""
    with pytest.raises(ValueError) as caught:
        _load(tmp_path, text)
    assert type(caught.value) is ValueError  # not a ZeroDivisionError, RecursionError or other raw error
    message = str(caught.value)
    assert f"poptorch.conf:{line}: " in message, message[:500]
    assert len(message) < 1_200, message[:2_000]
    return message


# -- a value a setter refuses: the file, the line, the setter, the value and the setter's rule ------------


@pytest.mark.parametrize(
    "line, setter, value, rule",
    [
        (
            "Training.gradientAccumulation(0)",
            "Training.gradientAccumulation",
            "0",
            "must be a positive integer",
        ),
        ("deviceIterations(-3)", "deviceIterations", "-3", "must be a positive integer"),
        ("outputMode(OutputMode.EveryN, 0)", "outputMode", "OutputMode.EveryN, 0", "positive integer"),
        ("randomSeed('x')", "randomSeed", "'x'", "takes an int"),
        (
            "setAvailableMemoryProportion({'IPU0': 2})",
            "setAvailableMemoryProportion",
            "{'IPU0': 2}",
            "(0, 1]",
        ),
        ("deviceIterations(x=2)", "deviceIterations", "x=2", "unexpected keyword argument"),
        ("useIpuId('one')", "useIpuId", "'one'", "int"),
    ],
)
def test_a_value_a_setter_refuses_names_the_file_line_setter_and_value(tmp_path, line, setter, value, rule):
    message = _refused(tmp_path, f"deviceIterations(2)\n# a comment\n{line}\n", line=3)
    assert f"the setter {setter} refused {value}: " in message
    assert rule in message


def test_set_on_a_line_goes_through_the_named_setters_checks(tmp_path):
    message = _refused(tmp_path, "set(device_iterations=0)\n")
    assert "the setter set refused device_iterations=0: " in message
    assert "deviceIterations must be a positive integer, got 0" in message
    message = _refused(tmp_path, "set(device_iteration=4)\n")
    assert "no option 'device_iteration'" in message and "did you mean 'device_iterations'" in message
    assert "unknown" not in _load(tmp_path, "set(device_iterations=3)\n").toDict()
    assert _load(tmp_path, "set(device_iterations=3)\n").device_iterations == 3


@pytest.mark.parametrize(
    "line, suggestion",
    [
        ("deviceIteration(4)", "did you mean deviceIterations?"),
        ("Training.gradientAccumulaton(4)", "did you mean Training.gradientAccumulation?"),
        ("Trainig.gradientAccumulation(4)", "did you mean Training?"),
        ("outputMode(OutputMode.Al)", "did you mean OutputMode.All?"),
        ("outputMode(OutputMod.All)", "did you mean OutputMode?"),
        ("setExecutionStrategy(poptorch.ShardedExecutio())", "did you mean poptorch.ShardedExecution?"),
        ("Precision.setPartialsType(torch.flaot16)", "did you mean torch.float16?"),
    ],
)
def test_a_misspelt_name_gets_a_suggestion(tmp_path, line, suggestion):
    message = _refused(tmp_path, line + "\n")
    assert suggestion in message and line in message


# -- arithmetic, containers and odd bytes: a clear error, never Python's own ----------------------------


@pytest.mark.parametrize(
    "line, reason",
    [
        ("deviceIterations(4/0)", "4/0: division by zero"),
        ("deviceIterations(4 - 4.0 / 0)", "4.0 / 0: float division by zero"),
        ("deviceIterations(" + "9" * 400 + " / 1.0)", "(400 digits) does not fit in 64 bits"),
        ("setAvailableMemoryProportion({[1]: 0.5})", "unhashable"),
        ("deviceIterations(**{'device_iterations': 4})", "** arguments are not literals"),
    ],
)
def test_a_value_that_cannot_be_computed_is_a_clear_error(tmp_path, line, reason):
    message = _refused(tmp_path, line + "\n")
    assert reason in message


def test_a_file_that_is_not_text_names_the_line(tmp_path):
    assert "not UTF-8 text" in _refused(tmp_path, b"deviceIterations(2)\n\xff\xfe(\n", line=2)
    assert "null byte" in _refused(tmp_path, b"deviceIterations(2\x00)\n")


# -- sizes: a huge or deeply nested line is refused before it is evaluated; quotes stay short -------------

HUGE = 300_000


@pytest.mark.parametrize(
    "line, reason",
    [
        ("deviceIterations(" + "1+" * HUGE + "1)", "longer than 10,000 characters"),
        ("deviceIterations('" + "x" * HUGE + "')", "longer than 10,000 characters"),
        ("deviceIterations(" + "1+" * 3_000 + "1)", "nested more than 50 levels deep"),
        ("deviceIterations(" + "[" * 150 + "]" * 150 + ")", "nested more than 50 levels deep"),
        ("deviceIterations(" + "[1," * 1_000 + "]" * 1_000 + ")", "nested more than 50 levels deep"),
        ("deviceIterations(" + "-" * 4_000 + "1)", "nested more than 50 levels deep"),
        ("deviceIterations(" + "9" * 5_000 + ")", "digits"),
        ("deviceIterations(2**64)", "is not a literal"),
        (
            "deviceIterations(" + "9" * 4_000 + " * " + "9" * 4_000 + ")",
            "(4,000 digits) does not fit in 64 bits",
        ),
        ("deviceIterations('" + "x" * 9_000 + "')", "(9,000 characters)"),
        (
            "setAvailableMemoryProportion({" + ", ".join(f"'IPU{i}': 0.5" for i in range(600)) + ", 'x': 1})",
            "got 'x': 1",
        ),
    ],
)
def test_a_huge_or_deeply_nested_line_is_refused_with_a_bounded_message(tmp_path, line, reason):
    message = _refused(tmp_path, "deviceIterations(2)\n" + line + "\n", line=2)
    assert reason in message


def test_a_line_at_the_limits_is_read(tmp_path):
    names = [f"layer{i}.running_mean" for i in range(400)]  # a long list of literals: 9,000 characters
    line = f"updatableNamedBuffers({names!r})"
    assert 9_000 < len(line) <= 10_000
    assert _load(tmp_path, line + "\n").updatable_named_buffers == names
    nested = "setAvailableMemoryProportion(" + "{'IPU0': " + "(" * 40 + "0.5" + ")" * 40 + "})"
    assert _load(tmp_path, nested + "\n").available_memory_proportion == {"IPU0": 0.5}


def test_the_line_quoted_in_a_message_is_a_bounded_prefix(tmp_path):
    message = _refused(tmp_path, "deviceIterations(open('" + "x" * 8_000 + "'))\n")
    assert re.search(r"deviceIterations\(open\('x{20,200}\.\.\. \(8,026 characters\)", message)
