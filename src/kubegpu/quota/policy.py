"""The admission side of GPU quotas, as in-tree CEL policies (no webhook): the objects `deploy/kubernetes/quota/`,
the operator and the chart ship.

Kubernetes 1.36 made MutatingAdmissionPolicy GA (`admissionregistration.k8s.io/v1`, on by default; the pinned 1.37
serves it), so the charge is added inside the API server: no webhook to run, certify or keep available. Every rule of
`kubegpu.sharing.charges` can be written in CEL over the pod and the table ConfigMap (`charges.table_data`): the
shapes of node the pod's node selector and required affinity leave possible (each requirement looked up in the
table, with the operators of `kube.selectors`), sizes read from MIG / MPS names with the same pattern, replicas from
the table. So there is no webhook at all.

* `kubegpu-gpu-memory` (MutatingAdmissionPolicy, pods CREATE): each container that asks for GPU resources and has no
  `kubegpu.io/gpu-memory` (or 0, what a LimitRange's `default: 0` gives) gets its charge in requests and limits
  (server-side-apply merge, so nothing else moves);
* `kubegpu-gpu-memory` (ValidatingAdmissionPolicy): a container whose own value is below its charge is refused with a
  message naming the pod, the container and the right value (a larger value is kept: it is the user's to give);
* `kubegpu-gpu-memory-table` (ValidatingAdmissionPolicy, no parameter): while the table is missing the two above are
  skipped (their bindings Allow a missing parameter, or every pod would be refused), and this one refuses a GPU
  container left uncharged, naming the table;
* `kubegpu-quota-gate` (MutatingAdmissionPolicy, parameter: the namespace's `ElasticQuota`s): a GPU pod in a namespace
  with an ElasticQuota starts behind the scheduling gate `kubegpu.io/quota`, which the quota controller lifts. A
  namespace without one finds no parameter and is left alone (`parameterNotFoundAction: Allow`). Its failure policy
  is `Ignore`: until the API server has synced the ElasticQuota kind (seconds after the CRD appears), or if the CRD
  is removed, GPU pods are admitted ungated rather than refused — a quota wait is a courtesy, the charge is the law.
* `kubegpu-claim-gate` (MutatingAdmissionPolicy, no parameter, `failurePolicy: Fail`): a pod with
  `spec.resourceClaims` starts behind the scheduling gate `kubegpu.io/gpu-memory`, which the quota controller lifts
  once each claim's charge is held by a charge-holder pod the ResourceQuota plugin admitted (`kubegpu.quota.holders`).
  No parameter, so no parameter cache a pod created right after its claim template could outrun;
* `kubegpu-gate-guard` (ValidatingAdmissionPolicy, no parameter): only the quota controller's ServiceAccount (and
  `system:masters`) may remove `kubegpu.io/gpu-memory` or `kubegpu.io/quota` from a pod, so pod-update rights are
  no way past a charge or a quota wait;
* `kubegpu-charge-holders` (ValidatingAdmissionPolicy, no parameter): only the quota controller creates or changes a
  pod labelled `kubegpu.io/gpu-memory-charge`; besides it only the garbage collector and namespace controller
  (kube-system's identities) and `system:masters` delete or evict one (an eviction deletes without a pod DELETE
  admission, so evictions of pods named `kubegpu-charge-*` are checked too): a user cannot give a charge back while
  its claim holds the GPUs.

The CEL is kept here, once, and rendered into every shipped copy; a test checks the copies are fresh and the real
API server test checks that the CEL and `kubegpu.sharing.charges` agree on every resource kind.
"""

from __future__ import annotations

from typing import Any

from kubegpu.quota.claims import CLAIM_GATE, HOLDER_LABEL, HOLDER_PREFIX
from kubegpu.scheduling.pods import QUOTA_GATE
from kubegpu.sharing.charges import (
    GIB,
    TABLE_BYTES_SUFFIX,
    TABLE_DEFAULT_KEY,
    TABLE_KEYS_KEY,
    TABLE_REPLICAS_PREFIX,
    TABLE_SHAPE_PREFIX,
    TABLE_SHAPES_KEY,
    TABLE_VALUES_PREFIX,
    ChargeTable,
    table_data,
)
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

NAMESPACE = "kubegpu"
TABLE_NAME = "kubegpu-gpu-memory"
CHARGE_POLICY = "kubegpu-gpu-memory"
TABLE_GUARD = "kubegpu-gpu-memory-table"
GATE_POLICY = "kubegpu-quota-gate"
CLAIM_GATE_POLICY = "kubegpu-claim-gate"
GATE_GUARD = "kubegpu-gate-guard"
HOLDER_GUARD = "kubegpu-charge-holders"
SERVICE_ACCOUNT = "kubegpu-quota"  # the quota controller's (kubegpu.quota.deploy)
LABELS = {"app.kubernetes.io/part-of": "kubegpu", "app.kubernetes.io/component": "quota"}
MAP_API = "admissionregistration.k8s.io/v1"

# ---------------------------------------------------------------------------------------------- CEL

_NAMED = r"^nvidia[.]com/(mig-.*[0-9]+gb.*|gpu-[0-9]+gb([.]shared)?)$"
"""The names that carry their size (`charges.named_memory_gib`): MIG profiles and MPS slices, `.shared` replicas too."""

_REQUIRED = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_HAS_REQUIRED = (f"has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) "
                 f"&& has({_REQUIRED})")
_LABEL = f"('{TABLE_SHAPE_PREFIX}' + s + '.' + e.key.replace('/', '_'))"
_INTEGER = "'^[+-]?[0-9]+$'"

_REQUIREMENT = f"""
!(e.key in variables.keys)
|| (e.operator == 'In' && {_LABEL} in params.data && has(e.values) && params.data[{_LABEL}] in e.values)
|| (e.operator == 'NotIn' && !({_LABEL} in params.data && has(e.values) && params.data[{_LABEL}] in e.values))
|| (e.operator == 'Exists' && {_LABEL} in params.data)
|| (e.operator == 'DoesNotExist' && !({_LABEL} in params.data))
|| ((e.operator == 'Gt' || e.operator == 'Lt') && {_LABEL} in params.data && has(e.values) && size(e.values) == 1
    && params.data[{_LABEL}].matches({_INTEGER}) && e.values[0].matches({_INTEGER})
    && (e.operator == 'Gt' ? int(params.data[{_LABEL}]) > int(e.values[0])
                           : int(params.data[{_LABEL}]) < int(e.values[0])))
""".strip()
"""CEL: requirement `e` holds on shape `s` (`ChargeTable._term_allows` with `LabelRequirement.matches_value`): a
label the table does not know may hold on some node; an absent label fails In, Exists, Gt and Lt."""

_LANDING = f"""
params.data['{TABLE_SHAPES_KEY}'].split(',').filter(s,
  (!has(object.spec.nodeSelector) || object.spec.nodeSelector.all(k, !(k in variables.keys)
     || (('{TABLE_SHAPE_PREFIX}' + s + '.' + k.replace('/', '_')) in params.data
         && params.data['{TABLE_SHAPE_PREFIX}' + s + '.' + k.replace('/', '_')] == object.spec.nodeSelector[k])))
  && (!({_HAS_REQUIRED}) || (has({_REQUIRED}.nodeSelectorTerms) && {_REQUIRED}.nodeSelectorTerms.exists(t,
        ((has(t.matchExpressions) && size(t.matchExpressions) > 0) || (has(t.matchFields) && size(t.matchFields) > 0))
        && (!has(t.matchExpressions) || t.matchExpressions.all(e, {_REQUIREMENT})))))
)
""".strip()
"""CEL: the ids of the shapes the pod may land on (`ChargeTable.landing_shapes`)."""

_UNKNOWN = f"""
(has(object.spec.nodeSelector) && object.spec.nodeSelector.exists(k, k in variables.keys
   && !(object.spec.nodeSelector[k] in params.data['{TABLE_VALUES_PREFIX}' + k.replace('/', '_')].split(','))))
|| (({_HAS_REQUIRED}) && has({_REQUIRED}.nodeSelectorTerms) && {_REQUIRED}.nodeSelectorTerms.exists(t,
      has(t.matchExpressions) && t.matchExpressions.exists(e, e.operator == 'In' && e.key in variables.keys
        && has(e.values)
        && e.values.exists(v, !(v in params.data['{TABLE_VALUES_PREFIX}' + e.key.replace('/', '_')].split(','))))))
""".strip()
"""CEL: the pod allows a pinning label's value no shape carries (`ChargeTable.names_unknown_gpu`)."""

_WHOLE = f"""
variables.unknown || variables.landing.size() == 0
  ? int(params.data['{TABLE_DEFAULT_KEY}'])
  : variables.landing.map(s, int(params.data['{TABLE_SHAPE_PREFIX}' + s + '.{TABLE_BYTES_SUFFIX}'])).max()
""".strip()


def _charges(field: str) -> str:
    """CEL: one int per container of `object.spec.<field>`: what its GPU requests are charged, in bytes."""
    replicas_key = f"'{TABLE_REPLICAS_PREFIX}' + k.replace('/', '_')"
    return f"""
!has(object.spec.{field}) ? [] : object.spec.{field}.map(c,
  has(c.resources) && has(c.resources.requests)
    ? c.resources.requests.transformList(k, v, k.startsWith('nvidia.com/'),
        quantity(string(v)).asInteger()
        * ((k.matches('{_NAMED}') ? int(k.find('[0-9]+gb').replace('gb', '')) * {GIB} : variables.whole)
           / (({replicas_key}) in params.data ? int(params.data[{replicas_key}]) : 1))).sum()
    : 0)
""".strip()


def _quantities(charges: str) -> str:
    """CEL: the charges as quantities, in Gi or Mi where exact (as `charges.quantity_of_bytes`)."""
    return (f"variables.{charges}.map(b, b % {GIB} == 0 ? string(b / {GIB}) + 'Gi' "
            f": (b % 1048576 == 0 ? string(b / 1048576) + 'Mi' : string(b)))")


def _owns(c: str) -> str:
    return f"(has({c}.resources) && has({c}.resources.requests) && '{GPU_MEMORY_RESOURCE}' in {c}.resources.requests)"


def _own_value(c: str) -> str:
    return f"quantity(string({c}.resources.requests['{GPU_MEMORY_RESOURCE}'])).asInteger()"


_ASKS_FOR_GPUS = """
object.spec.containers.exists(c, has(c.resources) && (
    (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('nvidia.com/')))
    || (has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('nvidia.com/')))))
|| (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && (
    (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('nvidia.com/')))
    || (has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('nvidia.com/'))))))
""".strip()

_POD_NAME = ("(has(object.metadata.name) && object.metadata.name != '' ? object.metadata.name "
             ": (has(object.metadata.generateName) ? object.metadata.generateName : ''))")


def _variables() -> list[dict[str, str]]:
    return [
        {"name": "keys", "expression": f"params.data['{TABLE_KEYS_KEY}'].split(',')"},
        {"name": "landing", "expression": _LANDING},
        {"name": "unknown", "expression": _UNKNOWN},
        {"name": "whole", "expression": _WHOLE},
        {"name": "charges", "expression": _charges("containers")},
        {"name": "initCharges", "expression": _charges("initContainers")},
        {"name": "quantities", "expression": _quantities("charges")},
        {"name": "initQuantities", "expression": _quantities("initCharges")},
    ]


def _apply(field: str, charges: str, quantities: str) -> str:
    patch = (f"Object.spec.{field}{{name: c.name, resources: Object.spec.{field}.resources{{"
             f"requests: {{'{GPU_MEMORY_RESOURCE}': variables.{quantities}[i]}}, "
             f"limits: {{'{GPU_MEMORY_RESOURCE}': variables.{quantities}[i]}}}}}}")
    # an own value of 0 counts as none: a LimitRange's `default: 0` gives every container one, GPU or not
    pick = f"variables.{charges}[i] > 0 && !({_owns('c')} && {_own_value('c')} > 0)"
    return (f"!has(object.spec.{field}) ? Object{{}} : "
            f"Object{{spec: Object.spec{{{field}: object.spec.{field}.transformList(i, c, {pick}, {patch})}}}}")


def _too_small(field: str, charges: str, quantities: str) -> tuple[str, str]:
    low = f"variables.{charges}[i] > 0 && {_owns('c')} && {_own_value('c')} < variables.{charges}[i]"
    check = f"!has(object.spec.{field}) || object.spec.{field}.all(i, c, !({low}))"
    message = (f"object.spec.{field}.transformList(i, c, {low}, 'container ' + c.name + ' asks "
               f"{GPU_MEMORY_RESOURCE}: ' + string(c.resources.requests['{GPU_MEMORY_RESOURCE}']) + ', below what its "
               f"GPU resources are charged; set it to at least ' + variables.{quantities}[i] + ' or leave it out')"
               f".join('; ')")
    return check, message


# ---------------------------------------------------------------------------------------------- objects


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


_POD_RULES = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["pods"]}]}


def table_configmap(table: ChargeTable | None = None, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The policy's parameter: the charge table as a ConfigMap (the operator re-renders it when the config changes)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(TABLE_NAME, namespace),
            "data": table_data(table)}


def charge_policies(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The mutating policy that adds the charge and the validating one that refuses a smaller own value."""
    conditions = [{"name": "asks-for-gpus", "expression": _ASKS_FOR_GPUS}]
    # Allow: the API server resolves the parameter before it evaluates matchConditions, so Deny would refuse every
    # pod, GPU or not, while the table is missing; the table guard below refuses the GPU pods left uncharged
    param_ref = {"name": TABLE_NAME, "namespace": namespace, "parameterNotFoundAction": "Allow"}
    checks = []
    for field, charges, quantities in (("containers", "charges", "quantities"),
                                       ("initContainers", "initCharges", "initQuantities")):
        check, message = _too_small(field, charges, quantities)
        checks.append({"expression": check, "messageExpression":
                       f"'pod ' + request.namespace + '/' + {_POD_NAME} + ': ' + {message}", "reason": "Invalid"})
    return [
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicy", "metadata": _meta(CHARGE_POLICY),
         "spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}, "matchConstraints": _POD_RULES,
                  "matchConditions": conditions, "variables": _variables(), "failurePolicy": "Fail",
                  "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "ApplyConfiguration",
                                 "applyConfiguration": {"expression": _apply(f, c, q)}}
                                for f, c, q in (("containers", "charges", "quantities"),
                                                ("initContainers", "initCharges", "initQuantities"))]}},
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(CHARGE_POLICY),
         "spec": {"policyName": CHARGE_POLICY, "paramRef": param_ref}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": _meta(CHARGE_POLICY),
         "spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}, "matchConstraints": _POD_RULES,
                  "matchConditions": conditions, "variables": _variables(), "failurePolicy": "Fail",
                  "validations": checks}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(CHARGE_POLICY),
         "spec": {"policyName": CHARGE_POLICY, "paramRef": param_ref, "validationActions": ["Deny"]}},
        *_table_guard(namespace),
    ]


def _table_guard(namespace: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy without a parameter: a container that asks for GPUs and carries no
    `kubegpu.io/gpu-memory` after the mutating policy ran was left uncharged, which happens only while the table is
    missing; it is refused with a message naming the table (the operator restores it)."""
    # requests, as the charge reads them (the API server has copied limits into them by now)
    uncharged = ("c.resources.requests.exists(k, k.startsWith('nvidia.com/') "
                 "&& quantity(string(c.resources.requests[k])).asInteger() > 0) "
                 f"&& !({_owns('c')} && {_own_value('c')} > 0)")
    checks = []
    for field in ("containers", "initContainers"):
        check = (f"!has(object.spec.{field}) || object.spec.{field}.all(c, !has(c.resources) "
                 f"|| !has(c.resources.requests) || !({uncharged}))")
        checks.append({"expression": check, "reason": "Forbidden", "messageExpression":
                       f"'pod ' + request.namespace + '/' + {_POD_NAME} + ': its GPU resources cannot be charged: "
                       f"the table ConfigMap {namespace}/{TABLE_NAME} is missing (kubegpu quota manifests, or the "
                       f"operator, restores it)'"})
    return [
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": _meta(TABLE_GUARD),
         "spec": {"matchConstraints": _POD_RULES,
                  "matchConditions": [{"name": "asks-for-gpus", "expression": _ASKS_FOR_GPUS}],
                  "failurePolicy": "Fail", "validations": checks}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(TABLE_GUARD),
         "spec": {"policyName": TABLE_GUARD, "validationActions": ["Deny"]}},
    ]


def gate_policies() -> list[dict[str, Any]]:
    """The mutating policy that holds a GPU pod behind `kubegpu.io/quota` where its namespace has an ElasticQuota."""
    gate = (f"Object{{spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: '{QUOTA_GATE}'}}]}}}}")
    return [
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicy", "metadata": _meta(GATE_POLICY),
         "spec": {"paramKind": {"apiVersion": "kubegpu.io/v1", "kind": "ElasticQuota"},
                  "matchConstraints": _POD_RULES,
                  "matchConditions": [{"name": "asks-for-gpus", "expression": _ASKS_FOR_GPUS}],
                  "failurePolicy": "Ignore", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": gate}}]}},
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(GATE_POLICY),
         "spec": {"policyName": GATE_POLICY,
                  "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}}},
    ]


def controller_user(namespace: str = NAMESPACE) -> str:
    """The quota controller's user name as the API server sees it (its ServiceAccount)."""
    return f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"


def _requester_is(namespace: str, *, collectors: bool) -> str:
    """CEL: the request comes from the quota controller or `system:masters` (break-glass); `collectors`: or from
    kube-system's controllers (the garbage collector and namespace controller, under their own ServiceAccounts or
    kube-controller-manager's user)."""
    allowed = (f"request.userInfo.username == '{controller_user(namespace)}' "
               "|| 'system:masters' in request.userInfo.groups")
    if collectors:
        allowed += (" || request.userInfo.username.startsWith('system:serviceaccount:kube-system:') "
                    "|| request.userInfo.username == 'system:kube-controller-manager'")
    return allowed


def claim_gate_policies(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The gate every pod with ResourceClaims starts behind, and the guards that keep users from lifting it or from
    touching a charge holder (module doc). None has a parameter: nothing for a new pod to outrun."""
    gate = f"Object{{spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: '{CLAIM_GATE}'}}]}}}}"
    gates = f"['{CLAIM_GATE}', '{QUOTA_GATE}']"
    lifts = (f"has(oldObject.spec.schedulingGates) && oldObject.spec.schedulingGates.exists(g, g.name in {gates} "
             "&& !(has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(h, h.name == g.name)))")
    lifted_message = (f"'pod ' + request.namespace + '/' + object.metadata.name + ': only the quota controller ("
                      f"{controller_user(namespace)}) removes the scheduling gates ' + "
                      f"{gates}.filter(n, oldObject.spec.schedulingGates.exists(g, g.name == n)).join(', ')")
    holder = "(request.operation == 'CREATE' ? object : oldObject)"
    # an eviction's object is the Eviction, whose name is the pod's: holders are told by their name's prefix there
    eviction = "(has(request.subResource) && request.subResource == 'eviction')"
    marked = (f"{eviction} ? request.name.startsWith('{HOLDER_PREFIX}') "
              f": (has({holder}.metadata.labels) && '{HOLDER_LABEL}' in {holder}.metadata.labels)")
    holder_rules = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                       "operations": ["CREATE", "UPDATE", "DELETE"],
                                       "resources": ["pods", "pods/eviction"]}]}
    holder_check = (f"request.operation == 'DELETE' || {eviction} "
                    f"? ({_requester_is(namespace, collectors=True)}) : ({_requester_is(namespace, collectors=False)})")
    holder_message = (f"'pod ' + request.namespace + '/' + request.name + ' holds a GPU-memory charge: "
                      f"only the quota controller ({controller_user(namespace)}) creates or changes it, and it goes "
                      f"with what it charges'")
    update_rules = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                       "resources": ["pods"]}]}
    return [
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicy", "metadata": _meta(CLAIM_GATE_POLICY),
         "spec": {"matchConstraints": _POD_RULES,
                  "matchConditions": [{"name": "has-resource-claims", "expression":
                                       "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0"}],
                  "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": gate}}]}},
        {"apiVersion": MAP_API, "kind": "MutatingAdmissionPolicyBinding", "metadata": _meta(CLAIM_GATE_POLICY),
         "spec": {"policyName": CLAIM_GATE_POLICY}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": _meta(GATE_GUARD),
         "spec": {"matchConstraints": update_rules,
                  "matchConditions": [{"name": "lifts-a-kubegpu-gate", "expression": lifts}],
                  "failurePolicy": "Fail",
                  "validations": [{"expression": _requester_is(namespace, collectors=False),
                                   "messageExpression": lifted_message, "reason": "Forbidden"}]}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(GATE_GUARD),
         "spec": {"policyName": GATE_GUARD, "validationActions": ["Deny"]}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": _meta(HOLDER_GUARD),
         "spec": {"matchConstraints": holder_rules,
                  "matchConditions": [{"name": "is-a-charge-holder", "expression": marked}],
                  "failurePolicy": "Fail",
                  "validations": [{"expression": holder_check, "messageExpression": holder_message,
                                   "reason": "Forbidden"}]}},
        {"apiVersion": MAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _meta(HOLDER_GUARD),
         "spec": {"policyName": HOLDER_GUARD, "validationActions": ["Deny"]}},
    ]
