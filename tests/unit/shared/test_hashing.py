"""Block hashing matches NVIDIA Dynamo 1.6.1 (``dynamo.llm.compute_block_hash_for_seq``)."""

from shared.hashing import (
    SEED,
    block_hash,
    extend_prefix_hashes,
    local_block_hashes,
    prefix_hashes,
    salted_seed,
    sequence_hashes,
)

# Produced by ai-dynamo 1.6.1: compute_block_hash_for_seq(tokens, block_size).
DYNAMO_GOLDEN = [
    (list(range(32)), 16, [15310707395893867146, 15292316782987903195]),
    (list(range(40)), 16, [15310707395893867146, 15292316782987903195]),
    ([1, 2, 3, 4], 4, [14643705804678351452]),
]


def test_local_block_hashes_match_dynamo_golden_vectors() -> None:
    for tokens, block_size, expected in DYNAMO_GOLDEN:
        assert local_block_hashes(tokens, block_size) == expected


def test_partial_trailing_block_is_not_hashed() -> None:
    assert local_block_hashes(list(range(15)), 16) == []


def test_sequence_hash_of_first_block_is_its_local_hash() -> None:
    local = local_block_hashes(list(range(32)), 16)
    seq = sequence_hashes(local)
    assert seq[0] == local[0]
    assert seq[1] != local[1]


def test_sequence_hash_depends_on_the_whole_prefix() -> None:
    a = sequence_hashes(local_block_hashes([*range(16), *range(100, 116)], 16))
    b = sequence_hashes(local_block_hashes([*range(1, 17), *range(100, 116)], 16))
    assert a[1] != b[1]
    assert (
        local_block_hashes([*range(16), *range(100, 116)], 16)[1]
        == local_block_hashes([*range(1, 17), *range(100, 116)], 16)[1]
    )


def test_salt_changes_the_seed_and_no_salt_keeps_1337() -> None:
    assert salted_seed() == SEED
    assert salted_seed(cache_salt="tenant-a") != SEED
    assert salted_seed(cache_salt="tenant-a") != salted_seed(cache_salt="tenant-b")
    assert block_hash([1, 2, 3, 4], salted_seed(cache_salt="t")) != block_hash([1, 2, 3, 4])


# Produced by ai-dynamo 1.6.1: compute_block_hash_for_seq(list(range(32)), 16, lora_name=...,
# cache_namespace=...). JetServe's ``cache_salt`` is Dynamo's ``cache_namespace``.
DYNAMO_SALTED_GOLDEN = [
    ({"lora_name": "my-lora"}, [7774427462321301335, 11306793257002815283]),
    ({"cache_salt": "tenant-a"}, [2130915519417463704, 14342547135021016991]),
    ({"cache_salt": "tenant-b"}, [6239091646721720205, 9185336402970972109]),
    (
        {"lora_name": "my-lora", "cache_salt": "tenant-a"},
        [9308087154931608541, 7049012067311110175],
    ),
    ({"lora_name": "", "cache_salt": ""}, [15310707395893867146, 15292316782987903195]),
]


def test_salted_local_hashes_match_dynamo_golden_vectors() -> None:
    for salt, expected in DYNAMO_SALTED_GOLDEN:
        assert local_block_hashes(list(range(32)), 16, salted_seed(**salt)) == expected, salt


def test_salted_seed_matches_dynamo_for_a_short_block() -> None:
    assert block_hash([1, 2, 3, 4], salted_seed(cache_salt="tenant-a")) == 5738685477468498325


def test_prefix_hashes_chain_salted_local_hashes_with_seed_1337() -> None:
    tokens = list(range(48))
    seed = salted_seed(lora_name="my-lora")
    assert prefix_hashes(tokens, 16, lora_name="my-lora") == sequence_hashes(
        local_block_hashes(tokens, 16, seed)
    )
    assert prefix_hashes(tokens, 16)[0] != prefix_hashes(tokens, 16, cache_salt="t")[0]


def test_block_hash_of_a_tuple_equals_the_list_form() -> None:
    assert block_hash((1, 2, 3, 4)) == block_hash([1, 2, 3, 4]) == 14643705804678351452


def test_extending_known_hashes_gives_the_whole_prompt_s_hashes() -> None:
    tokens = list(range(1, 60))
    for salt in (None, "tenant"):
        whole = prefix_hashes(tokens, 4, cache_salt=salt)
        for cut in (0, 4, 13, 40, 59):  # hashes of a prefix (a migrated request's original)
            known = prefix_hashes(tokens[:cut], 4, cache_salt=salt)
            assert list(extend_prefix_hashes(tokens, 4, known, cache_salt=salt)) == whole
    longer = prefix_hashes([*tokens, 7, 7, 7, 7, 7], 4)
    assert list(extend_prefix_hashes(tokens, 4, longer)) == prefix_hashes(tokens, 4)
