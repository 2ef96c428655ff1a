"""Hardware profiles: hw_profiles/<name>.toml, loaded and checked strictly.

A profile holds numbers only; each one names its source in the file's
[sources] table and the loader refuses a number without one. Unknown keys,
missing keys, wrong types and impossible values are refused in one line.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from algorithms.errors import ProfileError

# section -> key -> (type, lower bound or None, upper bound or None)
_POS = (0, None)
SCHEMA: dict[str, dict[str, tuple[type, object, object]]] = {
    "gpu": {"name": (str, None, None), "description": (str, None, None),
            "sm_count": (int, 1, 1024), "sm_clock_mhz": (float, 100, 5000)},
    "features": {"mma_sync": (bool, None, None), "wgmma": (bool, None, None),
                 "tma": (bool, None, None), "fp8": (bool, None, None)},
    "residency": {"max_threads_per_sm": (int, 32, 4096), "max_ctas_per_sm": (int, 1, 64),
                  "registers_per_sm": (int, 1024, 1 << 20),
                  "register_alloc_unit": (int, 1, 4096),
                  "smem_per_sm_bytes": (int, 1024, 1 << 22),
                  "smem_per_block_bytes": (int, 1024, 1 << 22),
                  "smem_reserved_per_cta_bytes": (int, 0, 1 << 16)},
    "tensor_cores": {"peak_dense_tflops_16bit": (float, 1, 100000),
                     "peak_dense_tflops_fp8": (float, 0, 100000),
                     "sustained_fraction": (float, 0.01, 1.0),
                     "mma_sync_relative_rate": (float, 0.01, 1.0),
                     "wgmma_rows": (int, 1, 1024), "wgmma_k_bytes": (int, 1, 1024)},
    "units": {"exp2_per_clk_per_sm": (float, 1, 4096), "alu_ops_per_clk_per_sm": (float, 1, 8192),
              "smem_bytes_per_clk_per_sm": (float, 1, 8192),
              "tensor_alu_serial_fraction": (float, 0.0, 1.0),
              "flash_step_latency_cycles": (float, 0.0, 1e5),
              # ... the same two of the chain with fp8 products (calibrate.py dot_chain_fp8)
              "tensor_alu_serial_fraction_fp8": (float, 0.0, 1.0),
              "flash_step_latency_cycles_fp8": (float, 0.0, 1e5)},
    "l2": {"capacity_bytes": (int, 0, 1 << 34),
           # loads start to miss past this LRU depth (gpusim/engine/l2_lines.py); >= capacity: a plain LRU
           "keep_all_bytes": (int, 0, 1 << 34),
           "bandwidth_gbps": (float, 1, 1e6),
           "hit_latency_cycles": (float, 0, 1e5), "sm_port_bytes_per_clk": (float, 1, 4096),
           "sm_store_bytes_per_clk": (float, 1, 4096), "sm_store_bytes_per_clk_per_warp": (float, 0.01, 4096),
           # per SM, by SM id: its L2 round trip less the median SM's (cycles); [] = all alike
           "sm_latency_offsets_cycles": (list, -1e4, 1e4)},
    "hbm": {"capacity_bytes": (int, 1 << 20, 1 << 50),
            "peak_bandwidth_gbps": (float, 1, 1e6), "sustained_bandwidth_gbps": (float, 1, 1e6),
            "latency_cycles": (float, 0, 1e5)},
    "copy": {"plain_load_latency_cycles": (float, 0, 1e5), "tma_extra_latency_cycles": (float, 0, 1e5),
             "tma_descriptor_setup_cycles": (float, 0, 1e6)},
    "launch": {"kernel_launch_us": (float, 0, 1e4), "cta_turnover_cycles": (float, 0.0, 1e6),
               # an SM starts its CTAs' warps one after another, this many cycles each (0: at once)
               "warp_dispatch_cycles": (float, 0.0, 1e5)},
}
# Sections whose values are text or flags, not numbers needing a source.
_UNSOURCED = {"gpu.name", "gpu.description", "features.mma_sync", "features.wgmma",
              "features.tma", "features.fp8"}


@dataclass(frozen=True)
class HardwareProfile:
    """A GPU's numbers, by section: profile.hbm.sustained_bandwidth_gbps etc."""

    name: str
    path: str
    sections: MappingProxyType
    sources: MappingProxyType

    def __getattr__(self, section: str):
        if section.startswith("__"):
            raise AttributeError(section)
        try:
            return self.sections[section]
        except KeyError:
            raise AttributeError(section) from None

    # Derived quantities the engine and the accounting need, in SI units.
    @property
    def clock_hz(self) -> float:
        return self.gpu.sm_clock_mhz * 1e6

    def cycles_to_s(self, cycles: float) -> float:
        return cycles / self.clock_hz

    def matmul_flops_per_s_per_sm(self, kind: str, dtype: str) -> float:
        """Sustained tensor-core rate of one SM for `kind` ('mma.sync' or
        'wgmma') in `dtype`."""
        tc = self.tensor_cores
        peak = tc.peak_dense_tflops_fp8 if dtype == "fp8" else tc.peak_dense_tflops_16bit
        rate = peak * 1e12 * tc.sustained_fraction / self.gpu.sm_count
        if kind == "mma.sync" and self.features.wgmma:
            rate *= tc.mma_sync_relative_rate
        return rate

    def wgmma_operand_bytes(self, m: int, n: int, k: int, elem_bytes: int, a_in_smem: bool,
                            instr_n: int = 0) -> float:
        """Shared-memory bytes the tensor cores read for an [m, k] x [k, n] wgmma
        product: it runs as (m / wgmma_rows) x (n / instr_n) x (k bytes /
        wgmma_k_bytes) instructions, each reading its B slice (instr_n x
        wgmma_k_bytes) and, when A is in SMEM, its A slice (wgmma_rows x
        wgmma_k_bytes). So A is re-read once per N slice and B once per 64 rows."""
        tc = self.tensor_cores
        instr_n = instr_n or n
        k_bytes = k * elem_bytes
        a = m * k_bytes * (n / instr_n) if a_in_smem else 0.0
        b = n * k_bytes * (m / tc.wgmma_rows)
        return a + b

    def resolve_mma(self, kind: str, num_warps: int) -> str:
        """What an 'auto' matrix instruction becomes: wgmma on GPUs that have
        it when warps come in whole warpgroups (as Triton picks), else mma.sync."""
        if kind != "auto":
            return kind
        return "wgmma" if self.features.wgmma and num_warps % 4 == 0 else "mma.sync"

    def summary(self) -> dict:
        tc, hbm = self.tensor_cores, self.hbm
        return {
            "name": self.name, "description": self.gpu.description, "sms": self.gpu.sm_count,
            "clock_mhz": self.gpu.sm_clock_mhz,
            "peak_tflops_16bit": tc.peak_dense_tflops_16bit,
            "sustained_tflops_16bit": round(tc.peak_dense_tflops_16bit * tc.sustained_fraction, 1),
            "hbm_gb": hbm.capacity_bytes / 1e9, "hbm_gbps": hbm.sustained_bandwidth_gbps, "l2_mb": self.l2.capacity_bytes / 2**20,
            "smem_per_block_kb": self.residency.smem_per_block_bytes / 1024,
            "wgmma": self.features.wgmma, "tma": self.features.tma, "fp8": self.features.fp8,
        }


class _Section:
    """Read-only attribute view of one profile section."""

    def __init__(self, name: str, values: dict):
        self.__dict__["_name"], self.__dict__["_values"] = name, dict(values)

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"profile section [{self._name}] has no key {key!r}") from None

    def __setattr__(self, key, value):
        raise AttributeError("hardware profiles are read-only")

    def __getstate__(self):
        return (self._name, self._values)

    def __setstate__(self, state):
        self.__dict__["_name"], self.__dict__["_values"] = state

    def as_dict(self) -> dict:
        return dict(self._values)


def profiles_dir() -> Path:
    return Path(str(resources.files("hw_profiles")))


def available_profiles() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in profiles_dir().glob("*.toml"))


def _check_value(where: str, spec, value, path: str):
    typ, low, high = spec
    if typ is list:     # a list of numbers, each within the bounds
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value):
            raise ProfileError(f"{path}: {where} must be a list of numbers, got {value!r}"[:300])
        bad = [v for v in value if not low <= v <= high]
        if bad:
            raise ProfileError(f"{path}: {where} holds {bad[0]}, which is impossible; allowed range [{low}, {high}]")
        return tuple(float(v) for v in value)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ProfileError(f"{path}: {where} must be {typ.__name__}, got {value!r}")
    if low is not None and value < low or high is not None and value > high:
        raise ProfileError(f"{path}: {where} = {value} is impossible; allowed range [{low}, {high}]")
    return value


def parse_profile(data: dict, path: str) -> HardwareProfile:
    """Check a parsed TOML document against SCHEMA and build the profile."""
    unknown = set(data) - set(SCHEMA) - {"sources"}
    if unknown:
        raise ProfileError(f"{path}: unknown section [{sorted(unknown)[0]}]; allowed: "
                           f"{', '.join(SCHEMA)}, sources")
    sections = {}
    for section, keys in SCHEMA.items():
        table = data.get(section)
        if not isinstance(table, dict):
            raise ProfileError(f"{path}: missing section [{section}]")
        extra = set(table) - set(keys)
        if extra:
            raise ProfileError(f"{path}: unknown key {section}.{sorted(extra)[0]}; allowed: "
                               f"{', '.join(keys)}")
        values = {}
        for key, spec in keys.items():
            if key not in table:
                raise ProfileError(f"{path}: missing key {section}.{key}")
            values[key] = _check_value(f"{section}.{key}", spec, table[key], path)
        sections[section] = _Section(section, values)
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ProfileError(f"{path}: [sources] must be a table of \"section.key\" = \"source\"")
    numeric = {f"{s}.{k}" for s, keys in SCHEMA.items() for k in keys} - _UNSOURCED
    stray = set(sources) - numeric
    if stray:
        raise ProfileError(f"{path}: [sources] names unknown key {sorted(stray)[0]}")
    unsourced = sorted(k for k in numeric if not str(sources.get(k, "")).strip())
    if unsourced:
        raise ProfileError(f"{path}: {unsourced[0]} has no source in [sources]; every number needs one")
    _check_consistency(sections, path)
    return HardwareProfile(sections["gpu"].name, path, MappingProxyType(sections),
                           MappingProxyType(dict(sources)))


def _check_consistency(s: dict, path: str) -> None:
    if s["features"].fp8 and s["tensor_cores"].peak_dense_tflops_fp8 <= 0:
        raise ProfileError(f"{path}: features.fp8 is true but tensor_cores.peak_dense_tflops_fp8 is 0")
    if s["features"].wgmma and not s["features"].tma:
        raise ProfileError(f"{path}: features.wgmma without features.tma is no GPU we know")
    res = s["residency"]
    if res.smem_per_block_bytes > res.smem_per_sm_bytes:
        raise ProfileError(f"{path}: residency.smem_per_block_bytes exceeds smem_per_sm_bytes")
    offsets = s["l2"].sm_latency_offsets_cycles
    if offsets and len(offsets) != s["gpu"].sm_count:
        raise ProfileError(f"{path}: l2.sm_latency_offsets_cycles has {len(offsets)} values; it needs one per SM "
                           f"(gpu.sm_count = {s['gpu'].sm_count}) or none")
    hbm = s["hbm"]
    if hbm.sustained_bandwidth_gbps > hbm.peak_bandwidth_gbps:
        raise ProfileError(f"{path}: hbm.sustained_bandwidth_gbps exceeds hbm.peak_bandwidth_gbps")


def load_profile(name_or_path: str) -> HardwareProfile:
    """A profile by name (see available_profiles()) or by path to a .toml file."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ProfileError(f"a GPU is a profile name ({', '.join(available_profiles())}), a path to a .toml "
                           f"file or a HardwareProfile, got {type(name_or_path).__name__}")
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.parent != Path("."):
        path = candidate
        if not path.is_file():
            raise ProfileError(f"profile file {name_or_path} does not exist")
    else:
        path = profiles_dir() / f"{name_or_path}.toml"
        if not path.is_file():
            raise ProfileError(f"unknown GPU {name_or_path!r}; known profiles: "
                               f"{', '.join(available_profiles())} (or a path to a .toml file)")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    return parse_profile(data, str(path))
