"""`zoo serve --ray`'s arguments, in the default run (no Ray started: that takes ~25 s here;
tests/serve/test_serve_ray.py runs the replicas, marked slow): the refusal without the `ray`
extra names the extra pyproject.toml declares; a wrong combination is one line before Ray is
imported; the deployment's settings are read back through Ray Serve's own validation; the
arguments of `serve run runtime.serve.ray_app:build_app` become the same options."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from runtime.serve.options import ServeOptions
from runtime.serve.replicas import ray_plan
from tests.support.helpers import assert_one_line_error, zoo
from tests.support.serve import ROOT


def test_ray_without_the_extra_names_the_pip_install(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    monkeypatch.delitem(sys.modules, "runtime.serve.ray_app", raising=False)
    # the extra named is the one pyproject.toml declares, with Ray Serve in it
    assert re.search(r'^ray = \[.*"ray\[serve\]"', (ROOT / "pyproject.toml").read_text(), re.M)
    line = assert_one_line_error(zoo("serve", tmp_path, "--ray"), "--ray", "ray",
                                 "pip install '.[ray]'")
    assert "missing" in line


@pytest.mark.parametrize(("args", "parts"), [
    (["--replicas", "2"], ["--replicas", "only with --ray"]),
    (["--autoscale", "1:3"], ["--autoscale", "only with --ray"]),
    (["--ray-address", "auto"], ["--ray-address", "only with --ray"]),
    (["--ray", "--replicas", "2", "--autoscale", "1:3"], ["--replicas and --autoscale"]),
    (["--ray", "--replicas", "0"], ["--replicas 0", ">= 1"]),
    (["--ray", "--autoscale", "3:1"], ["--autoscale '3:1'", "MIN <= MAX"]),
    (["--ray", "--autoscale", "two"], ["--autoscale 'two'", "MIN:MAX"]),
    (["--ray", "--port", "0"], ["--port 0", "--ray"]),
])
def test_a_wrong_ray_option_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        args: list[str], parts: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is needed
    monkeypatch.delitem(sys.modules, "runtime.serve.ray_app", raising=False)
    assert_one_line_error(zoo("serve", tmp_path, *args), *parts)


def test_the_deployment_settings_pass_ray_serves_validation() -> None:
    serve = pytest.importorskip("ray.serve")

    class Replica:
        pass

    options = ServeOptions(ray=True, autoscale=(1, 4), max_batch=8, max_queue=20)
    settings = ray_plan(options, exports=2).deployment_options(30)
    config = serve.deployment(Replica).options(**settings)._deployment_config
    scaling = config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas) == (1, 4)
    assert scaling.target_ongoing_requests == 8  # a full batch per replica
    # Ray never holds back a request the replica would take: past its own queue (each export
    # admits max_batch + max_queue, runtime/serve/models.py) the replica answers 429 itself
    assert config.max_ongoing_requests > 2 * (8 + 20)
    assert config.graceful_shutdown_timeout_s == 30
    fixed = serve.deployment(Replica).options(
        **ray_plan(ServeOptions(ray=True, replicas=3), 1).deployment_options(30))
    assert fixed.num_replicas == 3 and fixed._deployment_config.autoscaling_config is None


def test_serve_run_arguments_become_the_options(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from runtime.serve.ray_app import options_from

    folders, names, options = options_from({
        "exports": f"{tmp_path / 'a'},{tmp_path / 'b'}", "max_batch": "8", "replicas": "2",
        "names": "x,y", "public_metrics": "true", "autoscale": None})
    assert folders == [tmp_path / "a", tmp_path / "b"] and names == ["x", "y"]
    assert options == ServeOptions(ray=True, max_batch=8, replicas=2, names=("x", "y"),
                                   public_metrics=True)
    _, names, options = options_from({"exports": [str(tmp_path / "c")], "autoscale": "0:2"})
    assert names == ["c"] and options.autoscale == (0, 2)
    from registry.errors import ZooError

    with pytest.raises(ZooError, match="max_batches: not an option"):
        options_from({"exports": "a", "max_batches": "8"})
    with pytest.raises(ZooError, match="exports: missing"):
        options_from({"max_batch": "8"})


def test_the_kuberay_example_names_the_app_and_its_options() -> None:
    import yaml

    manifest = yaml.safe_load((ROOT / "examples/ray/rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    (application,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    module, _, builder = application["import_path"].partition(":")
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file() and builder == "build_app"
    options = {field.name for field in fields(ServeOptions)}
    assert set(application["args"]) - options == {"exports"}
    if importlib.util.find_spec("ray") is not None:  # the arguments read as `serve run` would
        from runtime.serve.ray_app import options_from

        _, names, read = options_from(application["args"])
        assert names == ["smollm2"] and read.autoscale == (1, 4) and read.threads == 2


def test_a_replicas_metrics_are_copied_into_rays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every series of the replica's /metrics becomes a Ray gauge of its name, labels and
    value, read back against this file's own parse of the text (and a model name with a quote,
    a backslash and a newline against the name itself)."""
    metrics = pytest.importorskip("ray.serve.metrics")
    from runtime.serve.metrics import Metrics
    from runtime.serve.ray_app import RayMetrics
    from tests.support.serve import LABEL, SAMPLE

    set_to: dict[tuple[str, tuple], float] = {}

    class Gauge:
        def __init__(self, name: str, description: str, tag_keys: tuple[str, ...]) -> None:
            self.name, self.keys = name, tag_keys

        def set(self, value: float, tags: dict[str, str]) -> None:
            assert set(tags) == set(self.keys)
            set_to[self.name, tuple(sorted(tags.items()))] = value

    monkeypatch.setattr(metrics, "Gauge", Gauge)
    odd = 'a "b"\\c\nd'
    source = Metrics()
    source.request(odd, "/v1/completions", 200)
    source.counted("m", 7, 3)
    source.first_token("m", 0.02)
    text = source.text([("m", 1, 2, 3, 4, 5)])
    RayMetrics(lambda: text).copy()
    expected = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, labels, value = SAMPLE.match(line).groups()
            expected[name, tuple(sorted(LABEL.findall(labels or "")))] = float(value)
    assert len(set_to) == len(expected) > 20
    assert sorted(set_to.values()) == sorted(expected.values())
    assert set_to["zoo_requests_total", (("model", odd), ("route", "/v1/completions"),
                                         ("status", "200"))] == 1
    assert set_to["zoo_batch_size", (("model", "m"),)] == 2


def test_a_taken_port_or_a_folder_not_an_export_is_one_line_before_ray_starts(
        tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert_one_line_error(zoo("serve", tmp_path, "--ray", "--port", port),
                              f"--port {port}", "cannot listen")
    assert_one_line_error(zoo("serve", tmp_path / "nothing", "--ray", "--port", port),
                          "nothing", "no such folder")
