"""A component's options, read from its builder's signature and checked in one place."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from fedveil.options import check_options, keyword_options


def builder(input_shape, num_classes, width: float = 1.0, hidden: Sequence[int] = (8,), *, norm: str = "batch"):
    return width, hidden, norm


def test_options_are_the_keyword_parameters_besides_the_data_ones():
    assert keyword_options(builder, exclude=("input_shape", "num_classes")) == {
        "width": 1.0, "hidden": (8,), "norm": "batch",
    }
    assert keyword_options(builder, skip_first=2) == keyword_options(builder, exclude=("input_shape", "num_classes"))


def test_an_unknown_option_is_one_line_with_the_nearest_name_and_the_accepted_ones():
    with pytest.raises(ValueError) as err:
        check_options(builder, {"widht": 2}, "model 'toy'", exclude=("input_shape", "num_classes"))
    assert str(err.value) == (
        "model 'toy' has no option 'widht' (did you mean 'width'?); accepted: width=1.0, hidden=(8,), norm='batch'"
    )


@pytest.mark.parametrize("options", [{"width": "wide"}, {"hidden": 3}, {"hidden": ["a"]}, {"norm": 2}])
def test_a_value_its_annotation_refuses_names_the_option(options):
    (option, value), = options.items()
    with pytest.raises(ValueError, match=rf"^model 'toy': option '{option}': .* \(got {value!r}\)$".replace("[", r"\[")):
        check_options(builder, options, "model 'toy'", skip_first=2)


def test_lax_values_pass_unconverted():
    options = {"width": 1, "hidden": [4, 4]}
    check_options(builder, options, "model 'toy'", skip_first=2)  # an int fits a float, a list a sequence
    assert options == {"width": 1, "hidden": [4, 4]}


def test_a_zoo_model_and_a_loader_are_checked_the_same_way():
    from fedveil.data.errors import DataError
    from fedveil.models import build_model
    from fedveil.runtime.dataset import check_loader_options

    with pytest.raises(ValueError, match=r"^model 'lenet': option 'width': .*\(got 'x'\)"):
        build_model("lenet", (1, 28, 28), 10, width="x")
    with pytest.raises(DataError, match=r"^data\.options: data set 'school' has no option 'normalise_target' "
                                        r"\(did you mean 'normalize_target'\?\)"):
        check_loader_options("school", {"normalise_target": True})
