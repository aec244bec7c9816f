"""A refusal's reason is bounded: it quotes what the client sent, and the log,
the events and the record must not carry whatever an attacker sends
(osfl.fl.runtime.rounds.refusal; issue "Hostile peers and damaged files,
round three")."""

from __future__ import annotations

from osfl.errors import UploadError
from osfl.fl.runtime.rounds import MAX_REASON_CHARS, refusal


def test_a_refusal_reason_is_cut_however_long_the_attacker_s_value() -> None:
    """A refusal quotes the upload's values; a 401-digit ``num_samples``
    made a 460-character line in the log, the events and the record."""
    long = UploadError(f"num_samples {'9' * 401} is above the bound", client=3, field="meta")
    said = refusal(3, long)
    assert len(said) < MAX_REASON_CHARS + 40 and said.endswith("more characters)")
    assert said.startswith(str(long)[:MAX_REASON_CHARS])
    short = ValueError("bad")
    assert refusal(2, short) == "[client 2, field '*'] ValueError while checking it: bad"


def test_a_reason_of_exactly_the_bound_is_whole_and_one_more_says_how_much_was_cut() -> None:
    at = ValueError(
        "x" * (MAX_REASON_CHARS - len("[client 1, field '*'] ValueError while checking it: "))
    )
    assert len(refusal(1, at)) == MAX_REASON_CHARS and not refusal(1, at).endswith(")")
    over = UploadError("y" * (MAX_REASON_CHARS + 7))
    assert refusal(1, over) == "y" * MAX_REASON_CHARS + "… (7 more characters)"
