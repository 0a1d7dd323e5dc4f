"""Hardware bfloat16 is read from /proc/cpuinfo's `flags`: AVX512-BF16 or AMX-BF16, on any of its
lines; other flags that mention bf16 or AVX-512 do not count. AMX is AMX-BF16 alone."""
from pdserve.engine.cpu_features import cpu_has_amx, cpu_has_hardware_bf16, has_amx, has_hardware_bf16

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
bugs\t\t: spectre_v1
"""
ZEN4 = "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 avx512_vbmi2\n"
ICE_LAKE = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_vbmi2\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_avx512_bf16_or_amx_means_hardware_bfloat16():
    assert has_hardware_bf16(SAPPHIRE_RAPIDS)
    assert has_hardware_bf16(ZEN4)
    assert has_hardware_bf16("flags\t: fpu amx_bf16 amx_tile\n")


def test_avx512_without_its_bf16_extension_or_no_flags_line_means_none():
    assert not has_hardware_bf16(ICE_LAKE)
    assert not has_hardware_bf16(GRAVITON)  # an arm64 `Features` line, not x86 `flags`
    assert not has_hardware_bf16("bugs\t: avx512_bf16\n")  # only the flags line counts
    assert not has_hardware_bf16("")


def test_a_missing_cpuinfo_reads_as_no_hardware_bfloat16(tmp_path):
    assert cpu_has_hardware_bf16(tmp_path / "absent") is False
    (tmp_path / "cpuinfo").write_text(ZEN4)
    assert cpu_has_hardware_bf16(tmp_path / "cpuinfo") is True


def test_amx_is_its_bf16_flag_on_the_flags_line():
    assert has_amx(SAPPHIRE_RAPIDS)
    assert not has_amx(ZEN4) and not has_amx(ICE_LAKE) and not has_amx(GRAVITON)
    assert not has_amx("bugs\t: amx_bf16\n")


def test_a_missing_cpuinfo_reads_as_no_amx(tmp_path):
    assert cpu_has_amx(tmp_path / "absent") is False
    (tmp_path / "cpuinfo").write_text(SAPPHIRE_RAPIDS)
    assert cpu_has_amx(tmp_path / "cpuinfo") is True
