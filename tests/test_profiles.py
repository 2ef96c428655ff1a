"""Hardware profiles: every shipped one loads; bad files are refused in one line."""
import tomllib

import pytest

from algorithms.errors import ProfileError
from gpusim.profile import available_profiles, load_profile, parse_profile, profiles_dir


def test_the_four_sxm_profiles_ship():
    assert {"a100-40gb", "a100-80gb", "h100", "h200"} <= set(available_profiles())


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "h100", "h200"])
def test_profile_loads_and_every_number_has_a_source(name):
    gpu = load_profile(name)
    assert gpu.name == name
    assert all(len(src) > 10 for src in gpu.sources.values())


def test_a100_lacks_hopper_features_explicitly():
    gpu = load_profile("a100-40gb")
    assert not (gpu.features.wgmma or gpu.features.tma or gpu.features.fp8)
    assert load_profile("h100").features.wgmma


def _h100_data():
    return tomllib.loads((profiles_dir() / "h100.toml").read_text())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["hbm"].update(bogus=1), "unknown key hbm.bogus"),
    (lambda d: d["hbm"].pop("latency_cycles"), "missing key hbm.latency_cycles"),
    (lambda d: d.pop("l2"), "missing section [l2]"),
    (lambda d: d.update(extra={}), "unknown section [extra]"),
    (lambda d: d["gpu"].update(sm_count=-4), "impossible"),
    (lambda d: d["gpu"].update(sm_count="many"), "must be int"),
    (lambda d: d["tensor_cores"].update(sustained_fraction=1.5), "impossible"),
    (lambda d: d["sources"].pop("hbm.latency_cycles"), "has no source"),
    (lambda d: d["sources"].update({"hbm.nothing": "x"}), "names unknown key"),
    (lambda d: d["hbm"].update(sustained_bandwidth_gbps=9999.0), "exceeds"),
])
def test_bad_profiles_are_refused_in_one_line(mutate, message):
    data = _h100_data()
    mutate(data)
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "bad.toml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_gpu_and_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="unknown GPU 'b200'; known profiles"):
        load_profile("b200")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(str(tmp_path / "x.toml"))
    bad = tmp_path / "broken.toml"
    bad.write_text("[gpu\nname=")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(str(bad))


def test_profile_from_a_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text((profiles_dir() / "h100.toml").read_text().replace('name = "h100"', 'name = "mine"'))
    assert load_profile(str(path)).name == "mine"


@pytest.mark.parametrize("offsets, says", [([1.0, 2.0], "one per SM"), (["x"] * 132, "list of numbers"),
                                           ([1e9] * 132, "impossible"), (3.0, "list of numbers")])
def test_sm_latency_offsets_are_a_number_per_sm_or_none(offsets, says):
    data = _h100_data()
    data["l2"]["sm_latency_offsets_cycles"] = offsets
    with pytest.raises(ProfileError, match=says) as e:
        parse_profile(data, "bad.toml")
    assert "\n" not in str(e.value)
    data["l2"]["sm_latency_offsets_cycles"] = [0.5] * 132
    assert parse_profile(data, "ok.toml").l2.sm_latency_offsets_cycles == (0.5,) * 132
