"""The real node's pieces that need no root: the sandbox image archive containerd imports,
and the configuration the node's processes are given."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

from dwell_dev import kubenode


def test_the_pause_archive_is_an_oci_image_whose_blobs_match_their_digests(
        tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    archive = kubenode.pause_archive(binary, tmp_path / "pause.oci.tar")
    with tarfile.open(archive) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == kubenode.PAUSE_IMAGE

    def blob(digest: str) -> bytes:
        data = files[f"blobs/sha256/{digest.split(':')[1]}"]
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
        return data

    manifest = json.loads(blob(entry["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer,) = manifest["layers"]
    raw = gzip.decompress(blob(layer["digest"]))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(raw).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        (member,) = t.getmembers()
        assert (member.name, member.mode) == ("pause", 0o755)
        assert t.extractfile(member).read() == binary.read_bytes()  # type: ignore[union-attr]


def test_the_node_serves_only_on_the_pod_bridge(tmp_path: Path) -> None:
    conf = kubenode.kubelet_config(tmp_path, tmp_path / "c.sock", tmp_path,
                                   {"kubelet": 10250, "kubelet_healthz": 10248})
    assert conf["address"] == kubenode.NODE_IP
    assert conf["healthzBindAddress"] == "127.0.0.1"
    assert conf["readOnlyPort"] == 0
    assert conf["authentication"]["anonymous"] == {"enabled": False}  # type: ignore[index]
    assert conf["cgroupDriver"] == "cgroupfs"
    assert f"bind {kubenode.NODE_IP}" in kubenode.coredns_corefile(tmp_path / "k", 8181)
    containerd = kubenode.containerd_config(tmp_path, tmp_path / "c.sock")
    assert "restrict_oom_score_adj = true" in containerd
    assert f'sandbox_image = "{kubenode.PAUSE_IMAGE}"' in containerd
    (bridge, _) = kubenode.cni_config(tmp_path)["plugins"]  # type: ignore[misc]
    assert bridge["ipam"]["ranges"] == [[{"subnet": kubenode.POD_SUBNET,
                                          "gateway": kubenode.NODE_IP}]]
