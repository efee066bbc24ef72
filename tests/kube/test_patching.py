from __future__ import annotations

from typing import Any

import pytest

from kubegpu.kube import Invalid
from kubegpu.kube.patching import clone, json_patch, merge_patch, strategic_merge_patch

# RFC 7386 Appendix A, case by case.
RFC7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "expected"), RFC7386)
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, expected: Any) -> None:
    original = clone(target)
    assert merge_patch(target, patch) == expected
    assert target == original  # the input is never modified


def test_json_patch_errors_are_invalid() -> None:
    with pytest.raises(Invalid, match="test failed"):
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    with pytest.raises(Invalid, match="cannot be applied"):
        json_patch({"a": 1}, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(Invalid, match="cannot be applied"):
        json_patch({"a": 1}, [{"op": "bogus", "path": "/a"}])


POD = {
    "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
    "spec": {
        "containers": [
            {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}], "args": ["--x"]},
            {"name": "sidecar", "image": "envoy"},
        ],
        "tolerations": [{"key": "a", "operator": "Exists"}],
    },
    "status": {"conditions": [{"type": "Ready", "status": "False"}]},
}

STRATEGIC = [
    pytest.param({"spec": {"containers": [{"name": "main", "image": "v2"}]}},
                 lambda pod: [c["image"] for c in pod["spec"]["containers"]] == ["v2", "envoy"],
                 id="containers merge by name"),
    pytest.param({"spec": {"containers": [{"name": "new", "image": "x"}]}},
                 lambda pod: [c["name"] for c in pod["spec"]["containers"]] == ["main", "sidecar", "new"],
                 id="unknown container is appended"),
    pytest.param({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}},
                 lambda pod: [c["name"] for c in pod["spec"]["containers"]] == ["main"],
                 id="patch delete removes an item"),
    pytest.param({"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]}]}},
                 lambda pod: [e["name"] for e in pod["spec"]["containers"][0]["env"]] == ["A", "B"],
                 id="env merges by name inside a container"),
    pytest.param({"spec": {"containers": [{"name": "main", "args": ["--y"]}]}},
                 lambda pod: pod["spec"]["containers"][0]["args"] == ["--y"],
                 id="args have no merge key and are replaced"),
    pytest.param({"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}},
                 lambda pod: pod["spec"]["tolerations"] == [{"key": "b", "operator": "Exists"}],
                 id="tolerations have no merge key and are replaced"),
    pytest.param({"metadata": {"finalizers": ["b", "a"]}},
                 lambda pod: pod["metadata"]["finalizers"] == ["a", "b"], id="finalizers merge as a set"),
    pytest.param({"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                 lambda pod: pod["status"]["conditions"] == [{"type": "Ready", "status": "True"}],
                 id="conditions merge by type"),
    pytest.param({"metadata": {"labels": {"$patch": "replace", "y": "2"}}},
                 lambda pod: pod["metadata"]["labels"] == {"y": "2"}, id="patch replace on a map"),
    pytest.param({"metadata": {"labels": {"x": None}}},
                 lambda pod: pod["metadata"]["labels"] == {}, id="null deletes like a merge patch"),
]


@pytest.mark.parametrize(("patch", "check"), STRATEGIC)
def test_strategic_merge_patch(patch: dict[str, Any], check: Any) -> None:
    original = clone(POD)
    assert check(strategic_merge_patch(POD, patch, "Pod"))
    assert original == POD


def test_strategic_merge_rejects_unsupported_directives_and_keyless_items() -> None:
    with pytest.raises(Invalid, match="directive '\\$setElementOrder/containers'"):
        strategic_merge_patch(POD, {"spec": {"$setElementOrder/containers": [{"name": "main"}]}}, "Pod")
    with pytest.raises(Invalid, match="merge key 'name'"):
        strategic_merge_patch(POD, {"spec": {"containers": [{"image": "x"}]}}, "Pod")
