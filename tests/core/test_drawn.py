"""drawn: the sha256 draws behind held-out splits, heldout-mix's picks and long prompts' contexts."""

from __future__ import annotations

import hashlib

from kimidflash.drawn import drawn, leading_within


def test_the_draw_is_sha256_of_salt_and_key_whatever_the_input_order():
    names = [f"task{i}" for i in range(20)]
    got = drawn(names, str, "s")
    assert got == sorted(names, key=lambda n: hashlib.sha256(f"s:{n}".encode()).hexdigest())
    assert drawn(reversed(names), str, "s") == got
    assert got != names and sorted(got) == sorted(names)  # a permutation, not the input order
    assert drawn(names, str, "t") != got  # another salt draws another order


def test_a_new_item_leaves_the_others_in_their_order():
    names = [f"task{i}" for i in range(20)]
    grown = drawn([*names, "task-new"], str, "s")
    assert [n for n in grown if n != "task-new"] == drawn(names, str, "s")


def test_the_key_function_names_each_item():
    items = [(i, f"x{i}") for i in range(10)]
    assert drawn(items, lambda it: it[1], "s") == sorted(
        items, key=lambda it: hashlib.sha256(f"s:{it[1]}".encode()).hexdigest()
    )


def test_leading_within_stops_at_the_first_item_that_does_not_fit():
    sizes = [3, 4, 1, 2]
    assert leading_within(sizes, int, 7) == [3, 4]
    assert leading_within(sizes, int, 6) == [3]  # the 1 after the 4 would fit, but nothing is skipped
    assert leading_within(sizes, int, 2) == []
    assert leading_within(sizes, int, 10) == sizes


def test_the_joiner_counts_between_two_items_only():
    assert leading_within([3, 4], int, 9, joiner=2) == [3, 4]
    assert leading_within([3, 4], int, 8, joiner=2) == [3]
    assert leading_within([3], int, 3, joiner=2) == [3]
