"""The soak: the whole local stack under a steady mixed-delay load for a long while, with
a random dwell process killed (-9) every minute and one Redis FLUSHALL half-way. Prints
what the fault suite prints (accepted, delivered, lost, early, duplicates at the Kafka
level and through the SDK) and each process's RSS: at the start (idle, before the load),
warm (after a minute of load in the process's last life: a minute after the load began,
or after its last restart) and at the end, once all was delivered; and each process's RSS
every minute of its last life, which shows whether it levels off or keeps growing.

    .venv/bin/python bench/soak.py                      # 10 min at 2,000 msg/s
    .venv/bin/python bench/soak.py --minutes 2 --rate 500

It runs devstack's `bench` profile (ports 10,700 above `make up`'s), its own servers,
and stops them when done. Exit status 1 when anything accepted was lost, arrived early,
or reached the SDK twice."""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid

from dwell.adapters import redis as redis_adapter
from dwell.core.topics import TopicName
from dwell_dev.workload import (
    Checker,
    FaultStack,
    Generator,
    SdkReader,
    format_table,
    now_ms,
    outcome,
    wait_delivered,
)

KILLABLE = FaultStack.DWELL
WARM_S = 60.0  # load a process has had when its warm RSS is taken
SERIES_S = 60.0  # how often the RSS of each process's last life is sampled


def _process(key: str) -> str:
    """The process an RSS figure belongs to: `spark-jvm` is the Spark app's."""
    return key.split("-")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=2000, help="messages a second")
    ap.add_argument("--max-delay-ms", type=int, default=60_000)
    ap.add_argument("--kill-every-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    stack = FaultStack("bench")
    try:
        stack.start_all()
        tenant = "soak" + uuid.uuid4().hex[:6]
        stack.make_namespace(tenant)
        topics = [f"persistent://{tenant}/ns/t{i}" for i in range(4)]
        admission = f"http://127.0.0.1:{stack.ports['admission']}"
        time.sleep(2)  # the namespace reaches admission through the policy feed
        checker = Checker(stack.kafka_bootstrap, [TopicName.parse(t).kafka_topic for t in topics])
        sdk = SdkReader(topics[0], "soak", stack.service_env(), stack.log_dir)
        # Requests of 100: one generator thread keeps up with 2,000 msg/s.
        gen = Generator(admission, topics, rate=args.rate, max_delay_ms=args.max_delay_ms,
                        batch=max(20, args.rate // 20), seed=args.seed)
        checker.start()
        sdk.start()
        time.sleep(10)  # let the stack settle before the first figure
        rss_start = stack.rss_kib()
        gen.start()
        t0, start_ms = time.monotonic(), now_ms()
        end = t0 + args.minutes * 60
        flushed = False
        next_kill = t0 + args.kill_every_s
        faults: list[str] = []
        rss_warm: dict[str, int] = {}
        # RSS samples of each process's last life, every SERIES_S of load.
        series: dict[str, list[int]] = {}
        next_sample = t0 + SERIES_S
        restarted: set[str] = set()
        born = dict.fromkeys(KILLABLE + ("redis", "kafka"), t0)  # start of each life
        while time.monotonic() < end:
            time.sleep(1)
            elapsed = time.monotonic() - t0
            warm_now = {n for n, t in born.items() if time.monotonic() >= t + WARM_S}
            if warm_now:
                for key, kib in stack.rss_kib().items():
                    if _process(key) in warm_now:
                        rss_warm[key] = kib
                for n in warm_now:
                    del born[n]
            if time.monotonic() >= next_sample:
                for key, kib in stack.rss_kib().items():
                    series.setdefault(key, []).append(kib)
                next_sample += SERIES_S
            if not flushed and elapsed >= args.minutes * 30:
                redis_adapter.connect(stack.redis_url).flushall()
                faults.append(f"{elapsed:5.0f}s  redis FLUSHALL")
                flushed = True
            if time.monotonic() >= next_kill:
                victim = rng.choice(KILLABLE)
                restarted.add(victim)
                stack.kill9(victim)
                stack.start(victim)
                born[victim] = time.monotonic()
                for key in [k for k in rss_warm if _process(k) == victim]:
                    del rss_warm[key]  # its warm figure is taken again in the new life
                for key in [k for k in series if _process(k) == victim]:
                    del series[key]
                faults.append(f"{elapsed:5.0f}s  kill -9 {victim} (back in "
                              f"{time.monotonic() - t0 - elapsed:.0f}s)")
                next_kill += args.kill_every_s
            with gen.out.lock:
                accepted = len(gen.out.deliver_at)
            print(f"\r{elapsed:5.0f}s  accepted {accepted:,}  delivered "
                  f"{checker.delivered(set(gen.out.deliver_at)):,}", end="", flush=True)
        print()
        gen.stop()
        sdk_ids = {i for i, t in gen.out.topic_of.items() if t == topics[0]}
        wait_delivered(gen.out, checker, 180, sdk, sdk_ids)
        time.sleep(5)
        rss_end = stack.rss_kib()
        checker.stop()
        sdk.stop()
        row = outcome(f"soak {args.minutes:g} min, {args.rate} msg/s", gen.out, checker, sdk,
                      start_ms)
        print("\nfaults:")
        for f in faults:
            print("  " + f)
        print()
        print(format_table([row]))
        print("\nRSS (MiB)            start     warm      end   end/start  end/warm")
        for name in sorted(set(rss_start) | set(rss_end)):
            a, w, b = (x.get(name, 0) / 1024 for x in (rss_start, rss_warm, rss_end))
            again = " (killed and restarted)" if _process(name) in restarted else ""
            warm = (f"{w:7.0f}", f"{b / w:9.2f}") if w else (f"{'-':>7}", f"{'-':>9}")
            print(f"  {name:<17} {a:7.0f}  {warm[0]}  {b:7.0f}   {b / a if a else 0:9.2f} "
                  f"{warm[1]}{again}")
        print(f"warm: after {WARM_S:.0f} s of load in the process's last life (-: restarted "
              f"less than {WARM_S:.0f} s before the load ended); a JVM's RSS is its heap's "
              "high-water mark (at most -Xmx), not what it uses")
        print(f"\nRSS (MiB) every {SERIES_S:.0f} s of load in the process's last life")
        for name in sorted(series):
            print(f"  {name:<17} " + " ".join(f"{kib / 1024:5.0f}" for kib in series[name]))
        ok = (row.lost, row.early, row.sdk_duplicates) == (0, 0, 0)
        print(f"\nlost {row.lost}, early {row.early}, SDK duplicates {row.sdk_duplicates}: "
              + ("ok" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        stack.down()
        for name in ("redis", "kafka"):
            stack.discard(name)


if __name__ == "__main__":
    sys.exit(main())
