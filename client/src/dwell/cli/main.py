"""`dwell-admin`: pulsar-admin's tenants, namespaces and topic-policies commands for
delayed delivery, over the policy service's HTTP API."""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Optional, TypeVar

import httpx
import typer
from rich.console import Console
from rich.table import Table
from typing_extensions import ParamSpec

from dwell import endpoints
from dwell.cli.client import AdminError, PolicyClient, path
from dwell.cli.flags import (
    FlagError,
    delayed_delivery_body,
    namespace_name,
    persistent_topic,
)
from dwell.cli.tokens import tokens
from dwell.client.auth import token_from_auth_params
from dwell.client.producer import PublishError, cancel_path, cancel_result
from dwell.core.durations import format_duration_ms
from dwell.core.positions import CANCELLED
from dwell.security import TlsSettings, http_verify


class Output(str, Enum):
    table = "table"
    json = "json"


class Ctx:
    def __init__(self, url: str, output: Output, token: str | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.client = PolicyClient(url, token=token, verify=verify)
        self.output = output
        self.console = Console()
        self.token = token
        self.verify = verify

    def done(self, message: str) -> None:
        """Confirm a change: a line in table mode, nothing in json mode (scripts read $?)."""
        if self.output is Output.table:
            self.console.print(message, highlight=False, soft_wrap=True)

    def emit(self, value: Any, render: Callable[[], Table | str]) -> None:
        if self.output is Output.json:
            typer.echo(json.dumps(value))
        else:
            self.console.print(render(), highlight=False)


P = ParamSpec("P")
R = TypeVar("R")


def command(group: typer.Typer, name: str, help_text: str
            ) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A subcommand whose errors end as one `error: ...` line on stderr and exit code 1."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except FlagError as exc:
                typer.echo(str(exc), err=True)
            except AdminError as exc:
                typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1)

        group.command(name, help=help_text)(run)
        return fn

    return register


app = typer.Typer(
    name="dwell-admin", no_args_is_help=True, add_completion=False,
    pretty_exceptions_enable=False,
    help="Administer dwell's tenants, namespaces and delayed-delivery policies, the way "
         "pulsar-admin does, over the policy service's HTTP API; cancel pending delayed "
         "messages through admission.")
tenants = typer.Typer(no_args_is_help=True, help="Create, list and delete tenants.")
namespaces = typer.Typer(no_args_is_help=True,
                         help="Create, list and delete namespaces; their delayed-delivery "
                              "policies.")
topic_policies = typer.Typer(no_args_is_help=True, help="Delayed-delivery policies of topics.")
messages = typer.Typer(no_args_is_help=True, help="Pending delayed messages.")
app.add_typer(tenants, name="tenants")
app.add_typer(namespaces, name="namespaces")
app.add_typer(topic_policies, name="topic-policies")
app.add_typer(messages, name="messages")
app.add_typer(tokens, name="tokens")


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(
        "--url", envvar=endpoints.POLICY_URL_ENV,
        help="Base URL of the policy service (https:// when it serves TLS)."),
    ] = endpoints.POLICY_URL,
    tls_trust_certs_file_path: Annotated[str, typer.Option(
        "--tls-trust-certs-file-path", envvar="DWELL_TLS_TRUST_CERTS_FILE_PATH",
        help="PEM file of the CA that signs the policy service's certificate (pulsar-admin's "
             "tlsTrustCertsFilePath); default: the system's CAs.")] = "",
    output: Annotated[Output, typer.Option(
        "--output", "-o", help="table: for people; json: the service's JSON on stdout, "
                               "for scripts.")] = Output.table,
    auth_params: Annotated[Optional[str], typer.Option(
        "--auth-params", envvar="DWELL_AUTH_PARAMS",
        help="The token to authenticate with, as pulsar-admin's authParams: token:<jwt> "
             "or file:<path of a file holding it>.")] = None,
) -> None:
    token = None
    if auth_params:
        try:
            token = token_from_auth_params(auth_params)
        except ValueError as exc:
            typer.echo(f"error: --auth-params: {exc}", err=True)
            raise typer.Exit(1) from None
    ctx.obj = Ctx(url, output, token, http_verify(TlsSettings(
        tls_trust_certs_file_path=tls_trust_certs_file_path)))


NamespaceArg = Annotated[str, typer.Argument(metavar="TENANT/NAMESPACE",
                                             help="The namespace, e.g. my-tenant/my-ns.")]
TopicArg = Annotated[str, typer.Argument(metavar="TOPIC",
                                         help="persistent://tenant/namespace/topic "
                                              "(or tenant/namespace/topic).")]
GlobalOpt = Annotated[bool, typer.Option(
    "--global", "-g", help="The topic's global policy (Pulsar's isGlobal), kept apart from "
                           "its local one; a field the local policy sets takes precedence.")]
AppliedOpt = Annotated[bool, typer.Option(
    "--applied", "-ap", help="Show the effective policy: every field resolved topic (local, then "
                      "global) → namespace → broker default, with where each value comes from.")]


def _list_table(header: str, items: list[str]) -> Table:
    table = Table(header)
    for item in items:
        table.add_row(item)
    return table


# -------------------------------------------------------------------- tenants


@command(tenants, "create", "Create a tenant.")
def tenant_create(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Argument(help="The tenant name.")],
    admin_roles: Annotated[str, typer.Option(
        "--admin-roles", "-r", help="Comma-separated admin roles.")] = "",
    allowed_clusters: Annotated[str, typer.Option(
        "--allowed-clusters", "-c", help="Comma-separated allowed clusters.")] = "",
) -> None:
    body = {"adminRoles": [r for r in admin_roles.split(",") if r],
            "allowedClusters": [c for c in allowed_clusters.split(",") if c]}
    ctx.obj.client.call("PUT", path("tenants", tenant), body=body)
    ctx.obj.done(f"Created tenant {tenant}")


@command(tenants, "list", "List the tenants.")
def tenant_list(ctx: typer.Context) -> None:
    names = ctx.obj.client.call("GET", path("tenants"))
    ctx.obj.emit(names, lambda: _list_table("tenant", names))


@command(tenants, "get", "Show a tenant's admin roles and allowed clusters.")
def tenant_get(ctx: typer.Context,
               tenant: Annotated[str, typer.Argument(help="The tenant name.")]) -> None:
    info = ctx.obj.client.call("GET", path("tenants", tenant))

    def render() -> Table:
        table = Table("field", "value")
        for key, values in info.items():
            table.add_row(key, ", ".join(values))
        return table

    ctx.obj.emit(info, render)


@command(tenants, "delete", "Delete a tenant; it must have no namespaces left.")
def tenant_delete(ctx: typer.Context,
                  tenant: Annotated[str, typer.Argument(help="The tenant name.")]) -> None:
    ctx.obj.client.call("DELETE", path("tenants", tenant))
    ctx.obj.done(f"Deleted tenant {tenant}")


# -------------------------------------------------------------------- namespaces


@command(namespaces, "create", "Create a namespace in an existing tenant.")
def namespace_create(ctx: typer.Context, namespace: NamespaceArg) -> None:
    ctx.obj.client.call("PUT", path("namespaces", *namespace_name(namespace)))
    ctx.obj.done(f"Created namespace {namespace}")


@command(namespaces, "list", "List a tenant's namespaces.")
def namespace_list(ctx: typer.Context,
                   tenant: Annotated[str, typer.Argument(help="The tenant name.")]) -> None:
    names = ctx.obj.client.call("GET", path("namespaces", tenant))
    ctx.obj.emit(names, lambda: _list_table("namespace", names))


@command(namespaces, "delete", "Delete a namespace (and its own delayed-delivery policy); "
                               "no topic in it may have a topic policy left.")
def namespace_delete(ctx: typer.Context, namespace: NamespaceArg) -> None:
    ctx.obj.client.call("DELETE", path("namespaces", *namespace_name(namespace)))
    ctx.obj.done(f"Deleted namespace {namespace}")


# -------------------------------------------------------------------- permissions

RoleArg = Annotated[str, typer.Option("--role", help="The role (a token's subject).")]


@command(namespaces, "grant-permission",
         "Grant a role permissions on a namespace (they replace what it had).")
def namespace_grant(ctx: typer.Context, namespace: NamespaceArg, role: RoleArg,
                    actions: Annotated[str, typer.Option(
                        "--actions", help="Comma-separated actions: produce, consume "
                                          "(also functions, sources, sinks, packages).")]
                    ) -> None:
    body = [a.strip() for a in actions.split(",") if a.strip()]
    ctx.obj.client.call("POST", path("namespaces", *namespace_name(namespace), "permissions",
                                     role), body=body)
    ctx.obj.done(f"Granted {', '.join(body)} on {namespace} to {role}")


@command(namespaces, "revoke-permission", "Revoke a role's permissions on a namespace.")
def namespace_revoke(ctx: typer.Context, namespace: NamespaceArg, role: RoleArg) -> None:
    ctx.obj.client.call("DELETE", path("namespaces", *namespace_name(namespace),
                                       "permissions", role))
    ctx.obj.done(f"Revoked the permissions of {role} on {namespace}")


@command(namespaces, "permissions", "Show the roles' permissions on a namespace.")
def namespace_permissions(ctx: typer.Context, namespace: NamespaceArg) -> None:
    perms = ctx.obj.client.call("GET", path("namespaces", *namespace_name(namespace),
                                            "permissions"))

    def render() -> Table:
        table = Table("role", "actions")
        for role, actions in sorted(perms.items()):
            table.add_row(role, ", ".join(actions))
        return table

    ctx.obj.emit(perms, render)


# -------------------------------------------------------------------- quotas

MaxTopicsOpt = Annotated[int, typer.Option("--max-topics-per-namespace", "-t",
                                           help="The maximum number of topics (0: no limit).")]
MaxSubscriptionsOpt = Annotated[int, typer.Option(
    "--max-subscriptions-per-topic", "-m",
    help="The maximum number of subscriptions per topic (0: no limit).")]


def _set_limit(ctx: typer.Context, namespace: str, name: str, value: int) -> None:
    ctx.obj.client.call("POST", path("namespaces", *namespace_name(namespace), name),
                        body=value)
    ctx.obj.done(f"Set {name} of {namespace} to {value}")


def _get_limit(ctx: typer.Context, namespace: str, name: str) -> None:
    value = ctx.obj.client.call("GET", path("namespaces", *namespace_name(namespace), name))
    ctx.obj.emit(value, lambda: "null (the broker's applies)" if value is None else str(value))


def _remove_limit(ctx: typer.Context, namespace: str, name: str) -> None:
    ctx.obj.client.call("DELETE", path("namespaces", *namespace_name(namespace), name))
    ctx.obj.done(f"Removed {name} of {namespace}: the broker's applies")


@command(namespaces, "set-max-topics-per-namespace",
         "Set the maximum number of topics of a namespace (a partition counts as a topic).")
def namespace_set_max_topics(ctx: typer.Context, namespace: NamespaceArg,
                             value: MaxTopicsOpt) -> None:
    _set_limit(ctx, namespace, "maxTopicsPerNamespace", value)


@command(namespaces, "get-max-topics-per-namespace",
         "Show the maximum number of topics a namespace set.")
def namespace_get_max_topics(ctx: typer.Context, namespace: NamespaceArg) -> None:
    _get_limit(ctx, namespace, "maxTopicsPerNamespace")


@command(namespaces, "remove-max-topics-per-namespace",
         "Remove a namespace's maximum number of topics.")
def namespace_remove_max_topics(ctx: typer.Context, namespace: NamespaceArg) -> None:
    _remove_limit(ctx, namespace, "maxTopicsPerNamespace")


@command(namespaces, "set-max-subscriptions-per-topic",
         "Set the maximum number of subscriptions per topic of a namespace.")
def namespace_set_max_subscriptions(ctx: typer.Context, namespace: NamespaceArg,
                                    value: MaxSubscriptionsOpt) -> None:
    _set_limit(ctx, namespace, "maxSubscriptionsPerTopic", value)


@command(namespaces, "get-max-subscriptions-per-topic",
         "Show the maximum number of subscriptions per topic a namespace set.")
def namespace_get_max_subscriptions(ctx: typer.Context, namespace: NamespaceArg) -> None:
    _get_limit(ctx, namespace, "maxSubscriptionsPerTopic")


@command(namespaces, "remove-max-subscriptions-per-topic",
         "Remove a namespace's maximum number of subscriptions per topic.")
def namespace_remove_max_subscriptions(ctx: typer.Context, namespace: NamespaceArg) -> None:
    _remove_limit(ctx, namespace, "maxSubscriptionsPerTopic")


# -------------------------------------------------------------------- delayed delivery

_SET_HELP = (
    "Set the delayed-delivery policy of {what}.\n\n"
    "Exactly one of --enable / --disable. Durations take units: 500ms, 1s, 10m, 5h, 3d "
    "(a bare number is seconds); 0 switches max and fixed delay off.\n\n"
    "Unlike pulsar-admin, a duration flag you leave out is not sent: that field keeps "
    "inheriting {inherit} (pulsar-admin would send -t 1s and -md 0 and override them). "
    "Example: -e -t 1s -md 5s sends "
    '{{"active": true, "tickTime": 1000, "maxDeliveryDelayInMillis": 5000}}.')

EnableOpt = Annotated[bool, typer.Option("--enable", "-e", help="Turn delayed delivery on.")]
DisableOpt = Annotated[bool, typer.Option(
    "--disable", "-d", help="Turn delayed delivery off: messages are delivered at once.")]
TimeOpt = Annotated[Optional[str], typer.Option(
    "--time", "-t", help="Tick time: the bucket width of the delayed-message index "
                         "(pulsar-admin default 1s; left out here, it inherits).")]
MaxOpt = Annotated[Optional[str], typer.Option(
    "--maxDelay", "-md", help="Max delay a producer may ask for; longer is rejected "
                              "(pulsar-admin default 0 = no limit; left out here, it "
                              "inherits).")]
FixedOpt = Annotated[Optional[str], typer.Option(
    "--fixed-delay", "-fd", help="Fixed delay forced on every message, overriding the "
                                 "producer's (PIP-437); left out, it inherits.")]


def _ms(value: int) -> str:
    return f"{value} ms ({format_duration_ms(value)})" if value else "0 (off)"


_FIELDS = (("active", "active"), ("tickTime", "tick time"),
           ("maxDeliveryDelayInMillis", "max delay"),
           ("fixedDeliveryDelayInMillis", "fixed delay"))


def _value(field: str, value: Any) -> str:
    if value is None:
        return "(inherits)"
    if field == "active":
        return "true" if value else "false"
    return _ms(int(value))


def _policy_table(policy: dict[str, Any], sources: dict[str, str] | None = None) -> Table:
    table = Table("field", "value", *(["from"] if sources is not None else []))
    for field, label in _FIELDS:
        row = [f"{label} ({field})", _value(field, policy.get(field))]
        if sources is not None:
            row.append(sources[field])
        table.add_row(*row)
    return table


def _sources(levels: list[tuple[str, dict[str, Any] | None]]) -> dict[str, str]:
    """Where each applied field comes from: the first level that sets it, else broker."""
    out = {}
    for field, _ in _FIELDS:
        out[field] = next((name for name, policy in levels
                           if policy is not None and policy.get(field) is not None), "broker")
    return out


def _show_policy(ctx: typer.Context, subject: str, policy: Any,
                 levels: list[tuple[str, dict[str, Any] | None]] | None) -> None:
    def render() -> Table | str:
        if policy is None:
            return f"No delayed-delivery policy set on {subject}: every field inherits."
        return _policy_table(policy, _sources(levels) if levels is not None else None)

    ctx.obj.emit(policy, render)


@command(namespaces, "set-delayed-delivery", _SET_HELP.format(
    what="a namespace", inherit="the broker default"))
def namespace_set(ctx: typer.Context, namespace: NamespaceArg, enable: EnableOpt = False,
                  disable: DisableOpt = False, time: TimeOpt = None, max_delay: MaxOpt = None,
                  fixed_delay: FixedOpt = None) -> None:
    body = delayed_delivery_body(enable=enable, disable=disable, time=time,
                                 max_delay=max_delay, fixed_delay=fixed_delay)
    ctx.obj.client.call("POST", path("namespaces", *namespace_name(namespace),
                                     "delayedDelivery"), body=body)
    ctx.obj.done(f"Set delayed delivery on {namespace}: {json.dumps(body)}")


@command(namespaces, "get-delayed-delivery",
         "Show a namespace's delayed-delivery policy as set (unset fields inherit), or with "
         "--applied the effective one.")
def namespace_get(ctx: typer.Context, namespace: NamespaceArg,
                  applied: AppliedOpt = False) -> None:
    url = path("namespaces", *namespace_name(namespace), "delayedDelivery")
    client = ctx.obj.client
    policy = client.call("GET", url, params={"applied": "true"} if applied else None)
    levels = None
    if applied and ctx.obj.output is Output.table:
        levels = [("namespace", client.call("GET", url))]
    _show_policy(ctx, namespace, policy, levels)


@command(namespaces, "remove-delayed-delivery",
         "Remove a namespace's delayed-delivery policy: every field inherits the broker "
         "default again.")
def namespace_remove(ctx: typer.Context, namespace: NamespaceArg) -> None:
    ctx.obj.client.call("DELETE", path("namespaces", *namespace_name(namespace),
                                       "delayedDelivery"))
    ctx.obj.done(f"Removed the delayed-delivery policy of {namespace}")


def _topic_url(topic: str) -> str:
    name = persistent_topic(topic)
    return path("persistent", name.tenant, name.namespace, name.local, "delayedDelivery")


def _global(is_global: bool) -> dict[str, str] | None:
    return {"isGlobal": "true"} if is_global else None


@command(topic_policies, "set-delayed-delivery", _SET_HELP.format(
    what="a topic", inherit="from the namespace, then the broker"))
def topic_set(ctx: typer.Context, topic: TopicArg, enable: EnableOpt = False,
              disable: DisableOpt = False, time: TimeOpt = None, max_delay: MaxOpt = None,
              fixed_delay: FixedOpt = None, is_global: GlobalOpt = False) -> None:
    body = delayed_delivery_body(enable=enable, disable=disable, time=time,
                                 max_delay=max_delay, fixed_delay=fixed_delay)
    ctx.obj.client.call("POST", _topic_url(topic), body=body, params=_global(is_global))
    ctx.obj.done(f"Set delayed delivery on {persistent_topic(topic)}: {json.dumps(body)}")


@command(topic_policies, "get-delayed-delivery",
         "Show a topic's own delayed-delivery policy (unset fields inherit), or with "
         "--applied the effective one and where each field comes from.")
def topic_get(ctx: typer.Context, topic: TopicArg, applied: AppliedOpt = False,
              is_global: GlobalOpt = False) -> None:
    name = persistent_topic(topic)
    client = ctx.obj.client
    params = _global(is_global) or {}
    policy = client.call("GET", _topic_url(topic),
                         params=params | ({"applied": "true"} if applied else {}))
    levels = None
    if applied and ctx.obj.output is Output.table:
        levels = [("topic", client.call("GET", _topic_url(topic))),
                  ("topic (global)", client.call("GET", _topic_url(topic),
                                                 params=_global(True))),
                  ("namespace", client.call("GET", path("namespaces", name.tenant,
                                                        name.namespace, "delayedDelivery")))]
    _show_policy(ctx, str(name), policy, levels)


@command(topic_policies, "remove-delayed-delivery",
         "Remove a topic's delayed-delivery policy: it inherits from its namespace again.")
def topic_remove(ctx: typer.Context, topic: TopicArg, is_global: GlobalOpt = False) -> None:
    ctx.obj.client.call("DELETE", _topic_url(topic), params=_global(is_global))
    ctx.obj.done(f"Removed the delayed-delivery policy of {persistent_topic(topic)}")


AdmissionOpt = Annotated[str, typer.Option(
    "--admission-url", envvar=endpoints.ADMISSION_URL_ENV,
    help="Base URL of the admission service, which takes cancels.")]


@command(messages, "cancel",
         "Cancel a pending delayed message by the messageId its publish returned: "
         "'cancelled' (it is never delivered), or why not: 'not_found' (never existed, or "
         "delivered already: the reason says which), 'too_late' (due, being delivered); "
         "exit code 1 unless cancelled.")
def message_cancel(ctx: typer.Context, topic: TopicArg,
                   message_id: Annotated[str, typer.Argument(
                       metavar="MESSAGE_ID", help="<kafkaTopic>:<partition>:<offset>, as "
                                                  "the publish returned it.")],
                   admission_url: AdmissionOpt = endpoints.ADMISSION_URL) -> None:
    name = persistent_topic(topic)
    headers = {"Authorization": f"Bearer {ctx.obj.token}"} if ctx.obj.token else None
    try:
        with httpx.Client(base_url=admission_url.rstrip("/"), timeout=30.0, headers=headers,
                          verify=ctx.obj.verify) as http:
            resp = http.delete(cancel_path(name, message_id))
    except httpx.HTTPError as exc:
        raise AdminError(f"cannot reach admission at {admission_url}: "
                         f"{exc or type(exc).__name__}") from exc
    try:
        result = cancel_result(resp).value
    except PublishError as exc:
        raise AdminError(str(exc)) from exc
    answer = resp.json()
    delivered = answer.get("delivered") is True
    ctx.obj.emit({"messageId": message_id, "result": result, "delivered": delivered},
                 lambda: f"{result}: {' '.join(str(answer.get('reason', '')).split())}")
    if result != CANCELLED:
        raise typer.Exit(1)
