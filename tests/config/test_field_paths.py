"""One field-path formatter for every model: pydantic's internal tags never reach the user, field names always do."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kubegpu.config import field_path, model_error_message


def test_field_names_that_look_like_type_tags_are_kept() -> None:
    # a field called `strategy` or `interval` once vanished from paths because it starts like pydantic's `str`/`int`
    assert field_path(("spec", "mig", "strategy")) == "spec.mig.strategy"
    assert field_path(("spec", "intervals", 0, "string")) == "spec.intervals[0].string"


def test_pydantic_tags_are_left_out() -> None:
    loc = ("spec", "function-after[_check(), Limits]", "limits", "union[str,int]", "str", "literal['a']", "cpu")
    assert field_path(loc) == "spec.limits.cpu"


def test_the_first_error_is_one_line_with_its_path() -> None:
    class Inner(BaseModel):
        strategy: int

    class Outer(BaseModel):
        mig: Inner

    with pytest.raises(ValidationError) as caught:
        Outer.model_validate({"mig": {"strategy": "x"}})
    assert model_error_message(caught.value).startswith("mig.strategy: Input should be a valid integer")
