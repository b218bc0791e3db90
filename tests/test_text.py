from gpulab.measuring.text import pct, plural, ratio, si, sig


def test_three_significant_figures_with_si_prefixes():
    assert si(123_376_394_007.9, "elements/s") == "123 Gelements/s"
    assert si(2.5e-3, "s") == "2.50 ms"
    assert si(989e12, "FLOP/s") == "989 TFLOP/s"
    assert si(None) == "n/a" and si(float("nan"), "s") == "n/a"
    assert sig(1234.5) == "1,230" and sig(0.012345) == "0.0123"
    assert pct(0.99997) == "100%" and sig(9.9996) == "10.0" and sig(-0.0099996) == "-0.0100"  # 07 read "100.0%"


def test_percent_ratio_and_plurals():
    assert pct(0.4734) == "47.3%" and pct(47.34, scale=1) == "47.3%" and pct(None) == "n/a"
    assert ratio(7.891) == "7.89x"
    assert plural(1, "kernel") == "1 kernel" and plural(3, "kernel") == "3 kernels" and plural(2, "pass") == "2 passes"


def test_a_tiny_percentage_says_so_instead_of_a_row_of_zeros():
    assert pct(2.6e-9) == "< 0.001%"  # 03's page read "tensor active, GPM 0.000000260%"
    assert pct(-2.6e-9) == "> -0.001%" and pct(0) == "0%" and pct(1.68e-5) == "0.00168%"


def test_a_count_drops_trailing_zeros():
    from gpulab.measuring.text import si_count
    assert si_count(9.0) == "9" and si_count(2000.0) == "2 k" and si_count(2.5) == "2.5"  # 09 read "9.00", "2.00 k"
    assert si_count(None) == "n/a" and si_count(1500.0, "B") == "1.5 kB"
