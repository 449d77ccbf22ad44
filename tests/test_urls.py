"""``core.urls.split_url``: the strict reader of URLs from other systems' answers (LiteLLM's
``api_base``, its alert text). Bad input is normal input: anything odd is "not readable", never a guess."""

from __future__ import annotations

import pytest

from gpuheal.core.urls import split_url


@pytest.mark.parametrize(
    "text,host_port,clean",
    [
        ("http://127.0.0.1:8080/v1", ("127.0.0.1", 8080), "http://127.0.0.1:8080/v1"),
        ("HTTP://CT8:8080", ("ct8", 8080), "http://ct8:8080"),
        ("http://ct8/v1/", ("ct8", 80), "http://ct8/v1/"),
        ("https://gpu.example.org/llama/v1", ("gpu.example.org", 443), "https://gpu.example.org/llama/v1"),
        ("http://[::1]:8081/v1", ("::1", 8081), "http://[::1]:8081/v1"),
        ("http://user:pw@127.0.0.1:8080/v1?key=k#f", ("127.0.0.1", 8080), "http://127.0.0.1:8080/v1"),
    ],
)
def test_a_url_is_read_without_its_secret_parts(text, host_port, clean):
    url = split_url(text)
    assert url is not None and url.host_port == host_port and url.clean == clean


@pytest.mark.parametrize(
    "text",
    [None, 8080, "", "ct8:8080", "//ct8:8080", "ftp://ct8/", "http://", "http://:8080", "http://ct8:0",
     "http://ct8:65536", "http://ct8:99999999", "http://ct8:80a", "http://ct8:-1", "http://ct 8:80",
     "http://ct8:8080/v1 x", "http://ct8\n:80", "http://ct8\x1b:80", "http://[zz]:80", "http://ct8:８０",
     "http://" + "a" * 3000, "http://ct8:80:81", "http://bad_host!:80"],
)  # fmt: skip
def test_anything_odd_is_not_readable(text):
    assert split_url(text) is None
