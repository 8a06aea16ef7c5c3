"""`make images` as a test (`make images-test`; `make test` leaves it out, since a cold
build takes many minutes): the two images built from docker/ with podman on a base made
with mmdebstrap, saved as OCI archives with their digests recorded, and run against the
real Redis and Kafka of the test profile (dwell_dev.image_check)."""

from __future__ import annotations

import json
import tarfile

from dwell_dev import image_check, images


def test_build_save_and_record() -> None:
    record = images.build_all(list(images.IMAGES))
    print(f"seconds: {record['seconds']}")
    recorded = json.loads(images.DIGESTS.read_text())
    for name in ["base", *images.IMAGES]:
        assert recorded[name]["digest"].startswith("sha256:"), recorded[name]
        assert recorded[name]["id"] == images.inspect(recorded[name]["image"])["id"]
    for name in images.IMAGES:
        archive = images.ROOT / recorded[name]["archive"]
        with tarfile.open(archive) as tar:
            members = set(tar.getnames())
            # An OCI image layout (podman load / skopeo read it) whose index names the
            # manifest the recorded digest names.
            assert {"oci-layout", "index.json"} <= members, sorted(members)[:10]
            index_file = tar.extractfile("index.json")
            assert index_file is not None
            index = json.loads(index_file.read())
        assert [m["digest"] for m in index["manifests"]] == [recorded[name]["archive_digest"]]


def test_images_run() -> None:
    got = image_check.main()
    assert got["spark_version"] == image_check.pyspark_pin()
    assert int(got["delivered_after_ms"]) >= image_check.DELAY_MS  # type: ignore[call-overload]
