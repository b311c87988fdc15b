"""The pure image core: finding image parts, what is refused before any read, data URLs, the
Qwen2-VL token rule and placeholder expansion (decision 032)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from services.preprocessor.images import (
    ImageLimits,
    ImageRef,
    LoadedImage,
    check_refs,
    decode_data_url,
    expand_placeholders,
    image_refs,
    image_tokens,
    measure,
    resized,
)
from shared.errors import InvalidRequest
from shared.messages import VisionSpec

VISION = VisionSpec(image_token_id=151655)
PAD = VISION.image_token_id


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_part(url: str, param: str | None = None) -> dict[str, object]:
    part: dict[str, object] = {"type": "image_url", "image_url": {"url": url}}
    if param is not None:
        part["param"] = param
    return part


class TestImageRefs:
    def test_finds_image_parts_in_prompt_order_named_by_their_place(self) -> None:
        messages = [
            {"role": "system", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, image_part("data:1")]},
            {"role": "user", "content": [image_part("data:2")]},
        ]
        assert image_refs(messages) == [
            ImageRef("messages[1].content[1]", "data:1"),
            ImageRef("messages[2].content[0]", "data:2"),
        ]

    def test_a_part_named_by_another_front_end_keeps_its_name(self) -> None:
        messages = [{"role": "user", "content": [image_part("data:1", "input[0].content[2]")]}]
        assert image_refs(messages)[0].param == "input[0].content[2]"

    def test_an_image_part_without_a_url_is_refused(self) -> None:
        part = {"type": "image_url", "image_url": {}}
        with pytest.raises(InvalidRequest, match=r"`messages\[0\].content\[0\]`: .*image_url.url"):
            image_refs([{"role": "user", "content": [part]}])


class TestCheckRefs:
    REFS = (
        ImageRef("messages[0].content[0]", "data:x"),
        ImageRef("messages[0].content[1]", "data:y"),
    )

    def test_a_text_only_model_refuses_images_naming_the_first(self) -> None:
        with pytest.raises(InvalidRequest, match="does not take images") as caught:
            check_refs(self.REFS, model="m", vision=None, limits=ImageLimits())
        assert caught.value.param == "messages[0].content[0]"

    def test_more_images_than_allowed_names_the_first_one_too_many(self) -> None:
        with pytest.raises(InvalidRequest, match="at most 1") as caught:
            check_refs(self.REFS, model="m", vision=VISION, limits=ImageLimits(max_images=1))
        assert caught.value.param == "messages[0].content[1]"

    def test_an_http_url_is_refused_when_no_host_is_allowed(self) -> None:
        refs = [ImageRef("p", "https://example.com/cat.png")]
        with pytest.raises(InvalidRequest, match=r"`example\.com` are not allowed"):
            check_refs(refs, model="m", vision=VISION, limits=ImageLimits())

    def test_an_allowed_host_and_its_subdomains_pass(self) -> None:
        limits = ImageLimits(url_domains=frozenset({"example.com"}))
        refs = [ImageRef("a", "https://example.com/x"), ImageRef("b", "http://img.example.com/y")]
        check_refs(refs, model="m", vision=VISION, limits=limits)

    def test_a_lookalike_host_is_not_a_subdomain(self) -> None:
        limits = ImageLimits(url_domains=frozenset({"example.com"}))
        with pytest.raises(InvalidRequest, match="not allowed"):
            check_refs(
                [ImageRef("a", "https://badexample.com/x")], model="m", vision=VISION, limits=limits
            )

    def test_a_star_allows_any_host(self) -> None:
        limits = ImageLimits(url_domains=frozenset({"*"}))
        check_refs(
            [ImageRef("a", "https://anywhere.test/x")], model="m", vision=VISION, limits=limits
        )

    def test_other_schemes_are_refused(self) -> None:
        limits = ImageLimits(url_domains=frozenset({"*"}))
        with pytest.raises(InvalidRequest, match="must be a `data:` URL or an http"):
            check_refs(
                [ImageRef("a", "file:///etc/passwd")], model="m", vision=VISION, limits=limits
            )


class TestDataUrls:
    def test_decodes_a_base64_data_url(self) -> None:
        data = png(3, 2)
        assert decode_data_url(ImageRef("p", data_url(data)), 10_000) == data

    def test_a_data_url_that_is_not_base64_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="must be base64"):
            decode_data_url(ImageRef("p", "data:image/png,rawbytes"), 10_000)

    def test_bad_base64_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="not valid base64"):
            decode_data_url(ImageRef("p", "data:image/png;base64,@@@@"), 10_000)

    def test_a_non_image_media_type_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="`text/plain` is not an image type"):
            decode_data_url(ImageRef("p", data_url(b"hello", "text/plain")), 10_000)

    def test_an_image_over_the_limit_is_refused_by_its_size(self) -> None:
        data = png(64, 64)
        with pytest.raises(InvalidRequest, match=f"larger than {len(data) - 1} bytes"):
            decode_data_url(ImageRef("p", data_url(data)), len(data) - 1)

    def test_bytes_that_are_no_image_are_refused_when_measured(self) -> None:
        with pytest.raises(InvalidRequest, match=r"`p`: the image could not be read"):
            measure(ImageRef("p", "data:"), b"just text", VISION)


class TestTokenRule:
    def test_exact_multiples_of_28_make_one_token_per_28_pixel_square(self) -> None:
        assert image_tokens(448, 224, VISION) == (448 // 28) * (224 // 28)

    def test_sizes_round_to_the_nearest_multiple_of_28(self) -> None:
        # 100 -> round(3.57) * 28 = 112, 50 -> round(1.79) * 28 = 56
        assert resized(100, 50, VISION) == (112, 56)
        assert image_tokens(100, 50, VISION) == 4 * 2

    def test_small_images_scale_up_to_min_pixels(self) -> None:
        w, h = resized(10, 10, VISION)
        assert w * h >= VISION.min_pixels
        assert image_tokens(10, 10, VISION) == (w // 28) * (h // 28)

    def test_large_images_scale_down_within_max_pixels(self) -> None:
        w, h = resized(10_000, 10_000, VISION)
        assert w * h <= VISION.max_pixels
        assert w % 28 == 0
        assert h % 28 == 0

    def test_aspect_kept_when_scaled_down(self) -> None:
        w, h = resized(8000, 4000, VISION)
        assert abs(w / h - 2) < 0.05

    def test_a_needle_thin_image_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="aspect ratio"):
            image_tokens(2010, 10, VISION, param="p")

    def test_measure_counts_by_the_header_size(self) -> None:
        image = measure(ImageRef("p", "data:"), png(56, 84), VISION)
        assert (image.format, image.width, image.height, image.tokens) == ("png", 56, 84, 2 * 3)


def loaded(tokens: int, mm_hash: str) -> LoadedImage:
    return LoadedImage("p", b"x", "png", 28, 28, tokens, mm_hash)


class TestExpandPlaceholders:
    def test_each_placeholder_becomes_the_image_s_token_count(self) -> None:
        ids, inputs = expand_placeholders(
            [1, 2, PAD, 3, PAD, 4], [loaded(3, "a" * 64), loaded(2, "b" * 64)], PAD
        )
        assert ids == (1, 2, PAD, PAD, PAD, 3, PAD, PAD, 4)
        assert [(i.offset, i.length, i.mm_hash[0]) for i in inputs] == [(2, 3, "a"), (6, 2, "b")]

    def test_a_placeholder_typed_in_message_text_is_refused(self) -> None:
        with pytest.raises(InvalidRequest, match="2 image placeholder tokens for 1 images"):
            expand_placeholders([PAD, 1, PAD], [loaded(3, "a" * 64)], PAD)
