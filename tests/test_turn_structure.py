"""train/turn_structure.py (and algos.turns.turn_first_positions): each response token's turn, each turn's
observation id."""

from __future__ import annotations

import pytest
import torch

from tests.algos_helpers import layout, random_episodes, t
from trajlake.train import turn_structure as AT
from trajlake.train.algos import turns as algos_turns


def test_turn_index_from_mask():
    m = t([[0, 1, 1, 0, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    expect = [[-1, 0, 0, -1, -1, 1, -1, 2], [0, 0, 0, 0, -1, -1, -1, -1], [-1] * 8]
    assert AT.turn_index_from_mask(m).tolist() == expect
    assert AT.turn_index_from_mask(m.bool()).dtype == torch.long


def test_turn_index_from_lengths():
    # row 0: turn 1 has an empty reply and turn 2 an empty prompt: the mask's runs merge turns 0 and 2...
    ti = AT.turn_index_from_lengths([[2, 1, 0], [1]], [[1, 0, 2], [3]], width=6)
    assert ti.tolist() == [[-1, -1, 0, -1, 2, 2], [-1, 0, 0, 0, -1, -1]]
    # ... turn_index_from_mask could not tell; with non-empty prompts and replies both agree
    assert AT.turn_index_from_mask(ti >= 0).tolist() == [[-1, -1, 0, -1, 1, 1], [-1, 0, 0, 0, -1, -1]]
    eps_list = random_episodes(5, [3, 3], 5)
    ti = layout(eps_list)["turn_index"]
    assert torch.equal(AT.turn_index_from_mask(ti >= 0), ti)
    with pytest.raises(ValueError, match="width"):
        AT.turn_index_from_lengths([[2]], [[3]], width=4)
    with pytest.raises(ValueError, match="turns"):
        AT.turn_index_from_lengths([[2, 1]], [[3]])


def test_turn_first_positions():
    ti = t([[-1, 0, 0, -1, 2, 2], [3, 3, 3, 3, 3, 3]], dtype=torch.long)
    m = (ti >= 0).long()
    assert algos_turns.turn_first_positions(ti, m).tolist() == [[1, -1, 4, -1], [-1, -1, -1, 0]]
    assert algos_turns.turn_first_positions(ti, m, num_turns=5).shape == (2, 5)


def test_observation_keys():
    k = AT.observation_key("You are in the kitchen.")
    assert k == AT.observation_key("You are in the kitchen.") and 0 <= k < 2 ** 63
    assert k != AT.observation_key("You are in the kitchen!") and AT.observation_key(None) == -1
    keys = AT.step_keys_from_observations([["a", "b", None], ["a"], []])
    assert keys.shape == (3, 3) and keys[0, 0] == keys[1, 0] != keys[0, 1]
    assert keys[0, 2] == keys[1, 1] == keys[2, 0] == -1
