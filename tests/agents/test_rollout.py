"""`agents.rollout`: the fraction of groups without reward spread, whatever the algorithm makes of them."""

from __future__ import annotations

import math

import torch

from agents.rollout import fraction_of_groups_without_spread


def test_a_group_without_spread_has_equal_valid_rewards_or_fewer_than_two() -> None:
    total = torch.tensor([1.0, 1.0, 0.5, 0.7, 2.0, math.nan, 3.0, 3.0])
    valid = torch.tensor([True, True, True, True, True, False, True, True])
    group_index = torch.arange(8) // 2
    # group 0: equal; group 1: spread; group 2: one valid reward; group 3: equal
    assert fraction_of_groups_without_spread(total, valid, group_index) == 0.75
    valid[0] = False
    total[3] = 0.5
    assert fraction_of_groups_without_spread(total, valid, group_index) == 1.0
    assert fraction_of_groups_without_spread(torch.arange(4.0), torch.ones(4, dtype=torch.bool), torch.arange(4) // 2) == 0.0
