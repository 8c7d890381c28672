# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Draw the roofline PNG from benchmark_dsv41_sparse_mla.py's JSON.

python benchmarks/kernels/plot_dsv41_sparse_mla_roofline.py RESULT.json [OUT.png]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(json_path: str, png_path: str) -> None:
    with open(json_path) as f:
        result = json.load(f)
    meta, rows = result["meta"], result["rows"]
    peak_bw, peak_flops = meta["peak_bw"], meta["peak_flops"]

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ridge = peak_flops / peak_bw
    xs = [1.0, ridge, 2000.0]
    ax.plot(xs, [min(peak_flops, x * peak_bw) / 1e12 for x in xs], "k-", lw=1.5)
    ax.annotate(
        f"{peak_bw / 1e12:.1f} TB/s, {peak_flops / 1e12:.0f} TFLOP/s",
        (ridge, peak_flops / 1e12),
        textcoords="offset points",
        xytext=(-40, 8),
        fontsize=8,
    )
    markers = {16: "o", 64: "s", 128: "^"}
    for row in rows:
        flops = row["tflops"] * 1e12 * row["time_us"] * 1e-6
        intensity = flops / row["bytes"]
        color = "tab:red" if row["kind"] == "prefill" else "tab:blue"
        ax.scatter(
            intensity,
            row["tflops"],
            marker=markers.get(row["heads"], "x"),
            color=color,
            s=20 + 0.3 * row["tokens"],
            alpha=0.8,
        )
        ax.annotate(
            f"T{row['tokens']}",
            (intensity, row["tflops"]),
            fontsize=6,
            xytext=(3, -3),
            textcoords="offset points",
        )
        if "flashmla_us" in row:
            # FlashMLA on the same inputs: same work, its own time.
            peer_tflops = flops / (row["flashmla_us"] * 1e-6) / 1e12
            ax.scatter(
                intensity,
                peer_tflops,
                marker=markers.get(row["heads"], "x"),
                facecolors="none",
                edgecolors="tab:green",
                s=20 + 0.3 * row["tokens"],
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(
        f"DSV4.1 Triton sparse MLA on {meta['gpu']}, {meta['date']}\n"
        f"circle/square/triangle = 16/64/128 heads; blue = ours (decode), "
        f"red = ours (prefill), green rings = FlashMLA",
        fontsize=8,
    )
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)


if __name__ == "__main__":
    src = sys.argv[1]
    plot(src, sys.argv[2] if len(sys.argv) > 2 else src.rsplit(".", 1)[0] + ".png")
