"""``%kdist status``: what each strategy holds, the last run, and the isolation in force."""

from __future__ import annotations

from ..cluster import namespace


def run(magics, rest: str) -> None:
    lines = ["kdist status"]
    if not magics._strategies:
        lines.append("  no strategy has run in this kernel yet")
    for name, strategy in magics._strategies.items():
        facts = ", ".join(f"{k}={v}" for k, v in strategy.status().items()) or "ready"
        lines.append(f"  {name}: {facts}")
    last = magics.last_record
    lines.append(f"  last run: {last.summary() if last else 'none'}")
    if not magics.same_user_only:
        lines.append(
            "  isolation: off (KDist.same_user_only = False): kdist's rendezvous and "
            "abort line accept any local user's connections"
        )
    why = namespace.unavailable() if magics.private_network else None
    lines.append(
        "  private network: "
        + (
            f"not here ({why}): the engines share this host's loopback"
            if why
            else "on: a cluster kdist starts gets a network of its own"
            if magics.private_network
            else "off (KDist.private_network = False): the engines share this host's loopback"
        )
    )
    print("\n".join(lines))
