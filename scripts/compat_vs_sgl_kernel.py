"""spec_hal.compat.sgl_kernel beside sgl-kernel's own CUDA kernels (GPU only): agreement and time.

    python scripts/compat_vs_sgl_kernel.py --peers PATH/TO/peers/sgl_ext [--markdown FILE]

Builds sgl-kernel's speculative kernels from the sources in ``--peers`` (``sgl_build.py`` there,
torch.utils.cpp_extension; needs nvcc), then per size runs both on the same inputs and reports
how many requests agree (greedy verification: all must; sampling: the final token
may differ where the float scan and the exact integer sums disagree) and the device time of each
(graph replay where it captures, else eager medians; spec_hal.bench.harness).
"""
from __future__ import annotations

import argparse
import sys

import torch


def _build(peers: str):
    sys.path.insert(0, peers)
    import sgl_build  # noqa: E402  (the peer folder's build helper)

    sgl_build.build("eagle")
    sgl_build.build("sampling")
    return torch.ops.sgl_peer_eagle, torch.ops.sgl_peer_sampling


def _buffers(bs, nodes, steps, device):
    return (torch.full((bs * nodes,), -1, dtype=torch.int32, device=device), torch.full((bs, steps + 1), -1, dtype=torch.int32, device=device),
            torch.zeros(bs, dtype=torch.int32, device=device))


def _agree(ours, theirs, bs):
    """Requests whose accept_index, accept_token_num and predicts on the accepted path all agree."""
    predicts_a, index_a, num_a = ours
    predicts_b, index_b, num_b = theirs
    same = (index_a == index_b).all(1) & (num_a == num_b)
    path = index_a.long().clamp(min=0)
    same &= ((predicts_a.long()[path] == predicts_b.long()[path]) | (index_a < 0)).all(1)
    return int(same.sum()), bs


def main(argv=None) -> int:
    from spec_hal.bench import harness
    from spec_hal.bench.examples import tree_verify_inputs
    from spec_hal.bench.report import print_table
    from spec_hal.compat import sgl_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", required=True, help="folder with sgl_build.py and the sgl-kernel sources")
    parser.add_argument("--markdown", help="write the table here as well")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    eagle, sampling = _build(args.peers)
    lines = ["| function | bs | N | V | agree | compat (us) | sgl-kernel (us) |", "|---|---:|---:|---:|---|---:|---:|"]
    for vocab in (32000, 128256):
        for bs in (1, 64, 256):
            for nodes, steps in ((4, 3), (8, 5)):
                tree, candidates, _, target_predict, target_probs, coins, final_coins = tree_verify_inputs(bs, nodes, steps, vocab, device)
                links = (tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling)
                ours, theirs = _buffers(bs, nodes, steps, device), _buffers(bs, nodes, steps, device)

                def compat_greedy():
                    sgl_kernel.verify_tree_greedy(*ours, candidates, *links, target_predict)

                def upstream_greedy():
                    eagle.verify_tree_greedy(*theirs, candidates, *links, target_predict)

                compat_greedy(), upstream_greedy()
                agree = _agree(ours, theirs, bs)
                lines.append(f"| verify_tree_greedy | {bs} | {nodes} | {vocab} | {agree[0]}/{agree[1]} | "
                             f"{harness.device_time_s(compat_greedy, device) * 1e6:.1f} | {harness.device_time_s(upstream_greedy, device) * 1e6:.1f} |")
                ours, theirs = _buffers(bs, nodes, steps, device), _buffers(bs, nodes, steps, device)
                draft_probs = torch.zeros_like(target_probs)

                def compat_sampling():
                    sgl_kernel.tree_speculative_sampling_target_only(*ours, candidates, *links, coins, final_coins, target_probs)

                def upstream_sampling():
                    # Upstream writes rejected tokens' probabilities into draft_probs; only the first
                    # call (the one compared) sees it all zero, as SGLang allocates it; the timed
                    # calls leave the memset out.
                    # The stream is read at each call: a graph capture runs on its own stream, and a
                    # launch on the stream of an earlier call is not captured (it timed 0.2 us).
                    sampling.tree_speculative_sampling_target_only(*theirs, candidates, *links, coins, final_coins, target_probs,
                                                                   draft_probs, 1.0, 1.0, True, torch.cuda.current_stream().cuda_stream)

                compat_sampling(), upstream_sampling()
                agree = _agree(ours, theirs, bs)
                lines.append(f"| tree_speculative_sampling_target_only | {bs} | {nodes} | {vocab} | {agree[0]}/{agree[1]} | "
                             f"{harness.device_time_s(compat_sampling, device) * 1e6:.1f} | {harness.device_time_s(upstream_sampling, device) * 1e6:.1f} |")
                print(lines[-2], lines[-1], sep="\n", flush=True)
    print_table(lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
