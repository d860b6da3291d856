"""The markdown tables the bench prints (every figure is in the JSON output too)."""

from __future__ import annotations

import os
import time

MB = 1e6


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def num(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def count(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def mb(n: int | None) -> str:
    return "" if not n else f"{n / MB:.0f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    right = ["---:" if i else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(right) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def time_table(results: dict[str, dict]) -> str:
    rows = []
    for name, res in results.items():
        fast, main = res["rsync_fastest_run"], res["rdc_run"]
        rows.append([
            name, fast["variant"], num(fast["seconds"]), num(main["seconds"]),
            num(res["time_ratio"]), num(res.get("time_ratio_warm")), num(res.get("cpu_ratio")),
            num(main["cpu"]), num(main["server_cpu"]), num(fast["cpu"]),
            mb(main["peak_rss"]), mb(main["server_peak_rss"]), mb(fast["peak_rss"]),
            "ok" if res["verified"] else "DIFFERS",
        ])
    return table(["case", "rsync fastest", "rsync s", "rdc s", "time ratio", "warm ratio",
                  "CPU ratio",
                  "rdc client CPU s", "rdc server CPU s", "rsync CPU s", "rdc client RSS MB",
                  "rdc server RSS MB", "rsync RSS MB", "receivers"], rows)


def bytes_table(results: dict[str, dict]) -> str:
    rows = []
    for name, res in results.items():
        best, main, bound = res["rsync_best_run"], res["rdc_run"], res["delta_bound"]
        rows.append([
            name, best["variant"], count(best["total"]), count(main["total"]),
            num(res["byte_ratio"]), num(res.get("byte_ratio_no_compress")),
            count(bound.get("xdelta3")), count(bound.get("zstd")),
            num(res["rdc_over_xdelta3"]), num(res["rdc_over_zstd"]),
        ])
    return table(["case", "rsync best", "rsync bytes", "rdc bytes", "byte ratio",
                  "no-zstd ratio", "xdelta3 -9", "zstd -19 patch-from", "rdc / xdelta3",
                  "rdc / zstd"], rows)


def targets_table(results: dict[str, dict]) -> str:
    rows = []
    for name, res in results.items():
        checks = [f"{c['what']} {num(c['value'])} <= {c['limit']}: "
                  f"{'meets' if c['meets'] else 'MISSES'}" for c in res["targets"]]
        rows.append([name, "; ".join(checks)])
    return table(["case", "targets (issues 12 and 18)"], rows)


def runs_table(results: dict[str, dict]) -> str:
    rows = []
    for name, res in results.items():
        for r in res["runs"]:
            label = f"{r['tool']} {r['variant']}"
            if r["tool"] == "rsync":
                marks = ("*" if r["variant"] == res["rsync_best_run"]["variant"] else "") + (
                    "+" if r["variant"] == res["rsync_fastest_run"]["variant"] else "")
                label += f" {marks}" if marks else ""
            rows.append([
                name, label, r["state"], count(r["sent"]), count(r["received"]),
                count(r["total"]), count(r["literal"]), num(r["seconds"]), num(r["cpu"]),
                num(r["server_cpu"]), mb(r["peak_rss"]), mb(r["server_peak_rss"]),
                r["verify"],
            ])
    return table(["case", "tool", "index", "sent", "received", "total", "literal", "s",
                  "CPU s", "server CPU s", "RSS MB", "server RSS MB", "verify"], rows)


def breakdown_lines(results: dict[str, dict]) -> list[str]:
    out = []
    for name, res in results.items():
        if "rdc_wire_by_role" not in res:
            continue
        total = sum(res["rdc_wire_by_role"].values()) or 1
        parts = ", ".join(f"{k} {v:,} ({v / total:.0%})"
                          for k, v in res["rdc_wire_by_role"].items())
        out.append(f"- {name}: {parts}")
        if res["rdc_wire_items"]:
            out.append("  (" + ", ".join(f"{k} {v:,}" for k, v in
                                         res["rdc_wire_items"].items()) + ")")
    return out


def idle_lines(idle: dict) -> list[str]:
    return [
        f"- idle `rdc serve`: {mb(idle['rss_fresh'])} MB RSS when started; pushed "
        f"{idle['files']:,} files ({idle['bytes'] / MB:.0f} MB) in {idle['push_seconds']:.1f} s "
        f"(server peak {mb(idle['server_peak_rss'])} MB); "
        + ", ".join(f"{mb(v)} MB {s} s after" for s, v in idle["rss_after"].items())
        + f" (target <= 80 MB: {'meets' if idle['meets_target'] else 'MISSES'})"
    ]


def print_report(results: dict[str, dict], idle: dict | None) -> None:
    if results:
        print("\n## Time and resources (headline rdc run: cold indexes, zstd)\n")
        print(time_table(results))
        print("\n(time ratio: rdc / rsync's fastest variant; warm ratio: rdc with both indexes "
              "built before timing (first copy: the client's); CPU ratio: rdc client + server CPU "
              "/ the fastest rsync's CPU (steadier than wall time under load); CPU = user + "
              "system; RSS = "
              "peak resident memory: rsync's is its processes' summed, rdc's server's is "
              "reset before each run; rsync's receiver and generator share pages after their fork, "
              "so its sum overstates)")
        print("\n## Bytes (sent + received) and the delta bound\n")
        print(bytes_table(results))
        print("\n(byte ratio: rdc / rsync's variant with the fewest bytes; xdelta3 and zstd "
              "hold both versions (tar pairs), a floor no sync protocol reaches)")
        print("\n## Targets\n")
        print(targets_table(results))
        print("\n## Every run\n")
        print(runs_table(results))
        print("\n(* rsync's fewest bytes, + rsync's fastest; rdc zstd bytes vary a few percent "
              "between runs: frames batch messages differently)")
        lines = breakdown_lines(results)
        if lines:
            print("\n## rdc bytes on the wire by role (one more push through a frame-counting "
                  "proxy, warm indexes)\n")
            print("\n".join(lines))
    if idle:
        print("\n## Idle server\n")
        print("\n".join(idle_lines(idle)))


def print_closing(load: tuple[float, float, float], started: float, log: list[str],
                  note: str = "") -> tuple[float, float, float]:
    """The last lines of a bench's report: the load average at both ends (``note`` after
    it), the time it took, and its problems or that every receiver was right. Returns
    the load average at the end."""
    end = os.getloadavg()
    print(f"\nload average at the start {load[0]:.2f}, at the end {end[0]:.2f}{note}; "
          f"{time.monotonic() - started:.0f} s")
    for line in log:
        print(f"problem: {line}")
    if not log:
        print("all receivers equal their senders (paths, contents, modes, mtimes)")
    return end
