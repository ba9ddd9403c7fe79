"""paged_attention.h's helpers against their scalar definitions, compiled on their own.

The header's softmax takes each lane's largest score through ``max_of`` (8 lanes at a time);
it must give the scalar ``std::fmax`` loop's result bit for bit (max is exact), for every
length (the 8-lane body and the tail), with masked (-inf) scores and NaNs, so the attention
outputs did not change when the loop was vectorized. A small C++ program includes the header
and prints both results for each case.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.engine.native.header_program import compile_program

PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include <random>
#include "paged_attention.h"

static float scalar_max(const float* x, int n) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) mx = std::fmax(mx, x[j]);
  return mx;
}

int main() {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.f, 30.f);
  std::uniform_int_distribution<int> pick(0, 9);
  int cases = 0, differ = 0;
  for (int n = 0; n <= 70; ++n) {
    for (int trial = 0; trial < 50; ++trial) {
      float x[70];
      for (int j = 0; j < n; ++j) {
        const int k = pick(gen);  // a tenth -inf (masked), a tenth NaN, one in 40 cases all -inf
        x[j] = k == 0 ? -INFINITY : k == 1 ? NAN : normal(gen);
        if (trial % 40 == 39) x[j] = -INFINITY;
      }
      const float a = tnd::max_of(x, n), b = scalar_max(x, n);
      uint32_t ua, ub;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      cases += 1;
      if (ua != ub) {
        differ += 1;
        std::printf("n=%d trial=%d vector=%a scalar=%a\n", n, trial, a, b);
      }
    }
  }
  std::printf("cases %d differ %d\n", cases, differ);
  return differ != 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_program(tmp_path_factory.mktemp("attn_helpers"), "max_of", PROGRAM)


def test_max_of_is_the_scalar_fmax_loop_bit_for_bit(program: Path) -> None:
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("cases 3550 differ 0"), proc.stdout
