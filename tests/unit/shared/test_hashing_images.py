"""Image hashes in block hashes (decision 032), by Dynamo's ``block_mm_infos`` scheme: a block
holding an image's tokens hashes its LE u32 tokens then the sorted LE u64 image hashes."""

import struct

import xxhash

from shared.hashing import (
    SEED,
    block_images,
    extend_prefix_hashes,
    local_block_hashes,
    prefix_hashes,
    salted_seed,
    sequence_hashes,
)
from shared.images import image_id, mm_spans, routing_hash
from shared.messages import ImageInput

PAD = 151655
A, B = 0x1111_2222_3333_4444, 0x5555_6666_7777_8888


def prompt(pads: int = 40) -> list[int]:
    return [*range(1, 21), *([PAD] * pads), *range(500, 540)]  # the image at 20..20+pads


def test_blocks_holding_image_tokens_are_the_ones_marked() -> None:
    assert block_images([(20, 40, A)], 16) == {1: (A,), 2: (A,), 3: (A,)}


def test_two_images_in_one_block_are_both_in_it() -> None:
    assert block_images([(2, 3, B), (6, 3, A)], 16) == {0: (B, A)}


def test_a_marked_block_hashes_its_tokens_then_the_sorted_image_hashes() -> None:
    tokens = list(range(16))
    expected = xxhash.xxh3_64_intdigest(
        struct.pack("<16I", *tokens) + struct.pack("<2Q", A, B), seed=SEED
    )
    assert local_block_hashes(tokens, 16, SEED, {0: (B, A)}) == [expected]


def test_blocks_without_images_hash_as_before() -> None:
    tokens = prompt()
    plain = local_block_hashes(tokens, 16)
    with_image = local_block_hashes(tokens, 16, SEED, block_images([(20, 40, A)], 16))
    assert with_image[0] == plain[0]
    assert with_image[4:] == plain[4:]
    assert all(with_image[i] != plain[i] for i in (1, 2, 3))


def test_the_same_image_in_the_same_place_gives_the_same_hashes() -> None:
    assert prefix_hashes(prompt(), 16, images=[(20, 40, A)]) == prefix_hashes(
        prompt(), 16, images=[(20, 40, A)]
    )


def test_another_image_of_the_same_size_matches_only_the_blocks_before_it() -> None:
    first = prefix_hashes(prompt(), 16, images=[(20, 40, A)])
    other = prefix_hashes(prompt(), 16, images=[(20, 40, B)])
    assert first[0] == other[0]
    assert all(x != y for x, y in zip(first[1:], other[1:], strict=True))


def test_image_hashes_combine_with_a_salt() -> None:
    salted = prefix_hashes(prompt(), 16, cache_salt="t", images=[(20, 40, A)])
    seed = salted_seed(cache_salt="t")
    expected = sequence_hashes(local_block_hashes(prompt(), 16, seed, {1: (A,), 2: (A,), 3: (A,)}))
    assert salted == expected


def test_extending_known_hashes_folds_images_past_them() -> None:
    tokens = prompt(pads=30)  # the image ends inside block 3, which the extension completes
    images = [(20, 30, A)]
    known = prefix_hashes(tokens[:50], 16, images=images)
    assert list(extend_prefix_hashes(tokens, 16, known, images=images)) == prefix_hashes(
        tokens, 16, images=images
    )


def test_an_image_s_routing_hash_is_the_first_16_hex_digits_of_its_id() -> None:
    mm_hash = image_id(b"\x89PNG fake")
    assert routing_hash(mm_hash) == int(mm_hash[:16], 16)
    image = ImageInput(mm_hash=mm_hash, offset=3, length=4, width=56, height=56)
    assert mm_spans([image]) == ((3, 4, int(mm_hash[:16], 16)),)
