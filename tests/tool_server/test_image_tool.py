"""The image tool (crop_image / zoom_in / rotate), end to end through the real server."""

import base64
import io
import time

import numpy as np
import pytest
from PIL import Image
from support.workspace_tools import call, finish, live, tool_call

from tool_server.launcher import run_server
from tool_server.tools.image import box_to_pixels, resolve_box, to_data_url


def decode(data_url: str) -> np.ndarray:
    assert data_url.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 100x80 RGB image whose every pixel is distinct, saved as a PNG file."""
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(80, 100, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("img") / "src.png"
    Image.fromarray(arr).save(path)
    return arr, str(path)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    # file_editor and run_tests share the <tool_call> tag and come first: routing must
    # still reach the image tool for image names only.
    with run_server(
        tools=["file_editor", "run_tests", "image"],
        timeout=10,
        workdir=str(tmp_path_factory.mktemp("wd")),
    ) as u:
        yield u


# --- pure geometry -------------------------------------------------------------------------
def test_box_formulas():
    assert box_to_pixels([0.5, 0.25, 1, 1], 100, 80) == (50.0, 20.0, 100.0, 80.0)
    assert box_to_pixels([0, 0, 1, 1], 100, 80, "pixel") == (0.0, 0.0, 1.0, 1.0)
    assert box_to_pixels([10, 10, 20, 20], 100, 80) == (10.0, 10.0, 20.0, 20.0)
    # padding in box units, clipped to the image, rounded outwards
    assert resolve_box([10, 10, 20.5, 20], 100, 80, padding=3) == (7, 7, 24, 23)
    assert resolve_box([0, 0, 100, 80], 100, 80, padding=50) == (0, 0, 100, 80)
    assert resolve_box([0.5, 0.5, 1, 1], 100, 80, padding=0.1) == (40, 32, 100, 80)
    with pytest.raises(ValueError, match="exceeds the width 100"):
        resolve_box([10, 10, 101, 20], 100, 80)
    with pytest.raises(ValueError, match="empty"):
        resolve_box([10, 10, 10, 20], 100, 80)
    with pytest.raises(ValueError, match="must be >= 0"):
        resolve_box([-1, 0, 10, 20], 100, 80)
    with pytest.raises(ValueError, match="4 numbers"):
        resolve_box([1, 2, 3], 100, 80)
    with pytest.raises(ValueError, match="padding"):
        resolve_box([1, 2, 3, 4], 100, 80, padding=-1)


# --- end to end ----------------------------------------------------------------------------
def test_crop_zoom_rotate_and_indexing(url, source):
    arr, path = source
    extra = {"images": [path]}
    obs, valid = call(url, "img-a", tool_call("crop_image", bbox=[10, 20, 50, 60]), extra)
    assert valid and obs["obs"].startswith("Image 1: 40x40 pixels")
    np.testing.assert_array_equal(decode(obs["image"]), arr[20:60, 10:50])

    # normalised box with padding (fractions of the image side), on the original image 0
    obs, valid = call(
        url,
        "img-a",
        tool_call("crop_image", bbox=[0.5, 0.5, 1.0, 1.0], padding=0.1, image_index=0),
        extra,
    )
    assert valid and "Image 2: 60x48 pixels" in obs["obs"]
    np.testing.assert_array_equal(decode(obs["image"]), arr[32:80, 40:100])

    # zoom_in on the image produced first (index 1): 2x size, box in its own pixels
    obs, valid = call(
        url, "img-a", tool_call("zoom_in", bbox=[0, 0, 20, 10], factor=2, image_index=1), extra
    )
    assert valid and "Image 3: 40x20 pixels" in obs["obs"]
    assert decode(obs["image"]).shape == (20, 40, 3)

    # rotate (default image: the latest, index 3) by 90 degrees is exact
    obs, valid = call(url, "img-a", tool_call("rotate", angle=90), extra)
    assert valid and "Image 4: 20x40 pixels" in obs["obs"] and "of image 3" in obs["obs"]
    obs2, _ = call(url, "img-a", tool_call("rotate", angle=90, image_index=1), extra)
    np.testing.assert_array_equal(decode(obs2["image"]), np.rot90(arr[20:60, 10:50]))
    obs3, _ = call(url, "img-a", tool_call("rotate", angle=30, image_index=0), extra)
    assert decode(obs3["image"]).shape[0] > 80  # expand=True keeps the corners
    finish(url, "img-a")


def test_data_url_images(url, source):
    arr, _ = source
    data_url = to_data_url(Image.fromarray(arr))
    obs, valid = call(
        url, "img-b", tool_call("crop_image", bbox=[0, 0, 5, 5]), {"images": [data_url, data_url]}
    )
    assert valid and obs["obs"].startswith("Image 2: 5x5 pixels")
    np.testing.assert_array_equal(decode(obs["image"]), arr[:5, :5])
    finish(url, "img-b")


@pytest.mark.parametrize(
    "action, expected",
    [
        (
            '<tool_call>{"name": "crop_image", "arguments": {"bbox": [1, 2, 3, 4]</tool_call>',
            "Invalid JSON in <tool_call>",
        ),
        (tool_call("crop", bbox=[0, 0, 5, 5]), "did you mean 'crop_image'"),
        (
            tool_call("crop_image", bbox=[0, 0, 5, 5], image_index=7),
            "image_index 7 does not exist; valid indices are 0...0",
        ),
        (tool_call("crop_image", bbox=[10, 10, 500, 20]), "x1=500 exceeds the width 100"),
        (tool_call("crop_image", bbox=[0.2, 0.2, 0.1, 0.9]), "the box is empty"),
        (tool_call("crop_image", bbox="0,0,5,5"), "list of 4 numbers"),
        (tool_call("crop_image"), 'missing argument "bbox"'),
        (tool_call("crop_image", bbox=[0, 0, 5, 5], scale=2), "unknown argument(s) ['scale']"),
        (tool_call("zoom_in", factor=100), '"factor" must be between 1 and 8'),
        (tool_call("rotate"), 'missing argument "angle"'),
        (tool_call("rotate", angle="ninety"), '"angle" must be a number'),
    ],
)
def test_errors_are_observations(url, source, action, expected):
    obs, valid = call(url, "img-err", action, {"images": [source[1]]})
    assert not valid
    assert expected in obs["obs"], obs
    assert "image" not in obs


def test_missing_images_and_bad_source(url, tmp_path):
    obs, valid = call(url, "img-none", tool_call("rotate", angle=90), {})
    assert not valid and "no images" in obs["obs"]
    obs, valid = call(
        url, "img-bad", tool_call("rotate", angle=90), {"images": [str(tmp_path / "missing.png")]}
    )
    assert not valid and 'extra_field["images"][0]: image file not found' in obs["obs"]
    for tid in ("img-none", "img-bad", "img-err"):
        finish(url, tid)


def test_other_tool_names_are_not_claimed(url):
    # an unrelated tool name is left to the router (no tool accepts it)
    obs, valid = call(url, "img-x", tool_call("python_exec", code="1"), {})
    assert not valid and "crop_image" not in obs["obs"]
    finish(url, "img-x")


def test_state_freed_on_finish(url, source):
    extra = {"images": [source[1]]}
    call(url, "img-f", tool_call("crop_image", bbox=[0, 0, 5, 5]), extra)
    assert live(url) >= 1
    finish(url, "img-f")
    # the produced image 1 is gone: a new trajectory state starts from the inputs again
    obs, valid = call(url, "img-f", tool_call("rotate", angle=90, image_index=1), extra)
    assert not valid and "image_index 1 does not exist" in obs["obs"]
    finish(url, "img-f")


def test_state_freed_by_ttl(tmp_path, source):
    with run_server(
        tools=["image"], timeout=10, state_ttl=0.5, sweep_interval=0.1, workdir=str(tmp_path)
    ) as u:
        obs, valid = call(
            u, "img-ttl", tool_call("crop_image", bbox=[0, 0, 5, 5]), {"images": [source[1]]}
        )
        assert valid and live(u) == 1
        deadline = time.monotonic() + 5
        while live(u) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live(u) == 0


# --- byte budgets: per trajectory, in total, memory returned --------------------------------
def test_over_budget_and_the_ledger():
    from tool_server.tools.image import ImageLedger, over_budget

    mib = 1 << 20
    assert over_budget(40 * mib, 40 * mib, 16 * mib, 56 * mib, 100 * mib) is None  # 56 == 56
    reason = over_budget(48 * mib, 48 * mib, 16 * mib, 56 * mib, 100 * mib)
    assert "56.0 MiB limit per trajectory (image_max_trajectory_mb)" in reason
    reason = over_budget(0, 96 * mib, 16 * mib, 56 * mib, 100 * mib)
    assert "100.0 MiB limit (image_max_total_mb)" in reason
    ledger = ImageLedger()
    ledger.reserve("a", 30, 50, 60)
    ledger.reserve("b", 30, 50, 60)
    with pytest.raises(ValueError, match="image_max_total_mb"):
        ledger.reserve("a", 1, 50, 60)
    assert ledger.release("a") == 30 and ledger.total == 30 and ledger.held("a") == 0
    ledger.reserve("a", 20, 50, 60)
    assert ledger.total == 50


def test_a_bad_budget_option_is_refused_at_start():
    from tool_server.kit.base import ToolSettings
    from tool_server.tools.image import ImageTool

    with pytest.raises(ValueError, match="image_max_total_mb"):
        ImageTool(ToolSettings(extra={"image_max_total_mb": "lots"}))


def _rss(url: str) -> int:
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            return psutil.Process(c.pid).memory_info().rss
    raise AssertionError("server process not found")


def test_byte_budgets_refuse_clearly_keep_serving_and_free_the_memory(tmp_path, source):
    """2048x2048 RGB is 16 MiB decoded. Per trajectory 56 MiB: the source and two rotations
    fit, the third rotation is refused. In total 90 MiB: a second trajectory's second
    rotation is refused (48 + 48 > 90). Finishing both gives the memory back, also under
    the trainer's keep-freed-memory glibc tunables, which the server inherits."""
    path = tmp_path / "big.png"
    Image.new("RGB", (2048, 2048), (10, 20, 30)).save(path)
    keep_freed = (
        "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"
    )
    with run_server(
        ["image"],
        timeout=20,
        workdir=str(tmp_path / "wd"),
        env={"GLIBC_TUNABLES": keep_freed},
        tool_opt={"image_max_trajectory_mb": 56, "image_max_total_mb": 90},
    ) as url:
        rotate, big = tool_call("rotate", angle=90), {"images": [str(path)]}
        small = {"images": [source[1]]}
        assert call(url, "warm", rotate, small)[1]  # imports and pools, before the baseline
        finish(url, "warm")
        rss0 = _rss(url)
        a = [call(url, "A", rotate, big) for _ in range(3)]
        assert [v for _, v in a] == [True, True, False], a[-1]
        assert "56.0 MiB limit per trajectory (image_max_trajectory_mb)" in a[-1][0]["obs"]
        assert call(url, "S", rotate, small)[1]  # the server keeps serving
        b = [call(url, "B", rotate, big) for _ in range(2)]  # A 48 + B 16, 32, 48 MiB
        assert [v for _, v in b] == [True, False], b[-1]
        assert "90.0 MiB limit (image_max_total_mb)" in b[-1][0]["obs"]
        held = _rss(url)
        assert held - rss0 > 64 << 20, (held - rss0) >> 20  # 80 MiB of pixels held
        for tid in ("A", "B", "S"):
            finish(url, tid)
        freed = _rss(url)
        assert freed - rss0 < 24 << 20, ((held - rss0) >> 20, (freed - rss0) >> 20)
        c = [call(url, "C", rotate, big) for _ in range(3)]  # the budgets are free again
        assert [v for _, v in c] == [True, True, False]
        finish(url, "C")
