"""gpuheal.memo.remembered: each key made once while remembered, a remembered None kept, the memo bounded."""

from gpuheal.memo import remembered


def test_a_key_is_made_once_and_a_none_answer_is_remembered_too():
    made = []

    def make(key):
        made.append(key)
        return None if key == "none" else key.upper()

    memo: dict = {}
    assert [remembered(memo, k, make, 10) for k in ("a", "none", "a", "none")] == ["A", None, "A", None]
    assert made == ["a", "none"]


def test_the_memo_never_holds_more_than_most_entries_and_answers_alike_after_it_is_emptied():
    memo: dict = {}
    for i in range(1000):
        assert remembered(memo, i, lambda k: k * 2, 16) == i * 2
        assert len(memo) <= 16
    assert remembered(memo, 3, lambda k: k * 2, 16) == 6
