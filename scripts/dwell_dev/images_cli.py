"""`make images` and `make images` check's command line (`python3 scripts/images.py`):
build, save and record the images (dwell_dev.images), and run them (dwell_dev.image_check).
"""

from __future__ import annotations

import argparse

from dwell_dev import ROOT, images, say


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="images", description=images.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="make the base, build, save and record the images")
    b.add_argument("names", nargs="*", metavar="|".join(images.IMAGES))
    sub.add_parser("check", help="run the built images against the test profile's Redis "
                                 "and Kafka: /healthz, a delayed publish that arrives, "
                                 "spark-submit --version")
    sub.add_parser("save", help="save the built images as OCI archives and record "
                                "their digests (what `build` does after building)")
    sub.add_parser("digests", help="print .dwell/images/digests.json")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        unknown = set(args.names) - set(images.IMAGES)
        if unknown:
            ap.error(f"unknown images: {', '.join(sorted(unknown))} "
                     f"(have {', '.join(images.IMAGES)})")
        images.build_all(args.names or list(images.IMAGES))
    elif args.cmd == "save":
        images.record(list(images.IMAGES), f"{images.BASE_REPO}:{images.debian_codename()}")
        say(f"saved under {images.OUT.relative_to(ROOT)}; "
            f"digests in {images.DIGESTS.relative_to(ROOT)}")
    elif args.cmd == "check":
        # The check runs dwell's clients: the venv's Python only (`build` runs before it).
        from dwell_dev import image_check

        image_check.main()
    else:
        print(images.DIGESTS.read_text() if images.DIGESTS.exists() else "{}", end="")
    return 0
