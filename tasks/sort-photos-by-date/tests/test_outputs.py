"""Outcome checks: exact photo tree (content = original name), other files left in incoming."""
import os

EXPECTED_PHOTOS = {
    "2023/04/15/101502.jpg": "IMG_20230415_101502.JPG",
    "2023/04/15/101502-1.jpg": "IMG_20230415_101502 (1).JPG",
    "2023/04/15/101502-2.jpg": "IMG_20230415_101502 (2).jpg",
    "2023/04/15/174455.jpg": "IMG_20230415_174455.jpg",
    "2023/04/16/080001.jpg": "IMG_20230416_080001.jpeg",
    "2023/05/01/090000.jpg": "IMG_20230501_090000.JPEG",
    "2023/05/01/090000-1.jpg": "IMG_20230501_090000 (1).jpeg",
    "2023/12/31/235959.jpg": "IMG_20231231_235959.JPG",
    "2024/01/01/000000.jpg": "IMG_20240101_000000.jpg",
    "2024/01/02/120000.jpg": "img_20240102_120000.JPG",
    "2024/02/29/134501.jpg": "IMG_20240229_134501.Jpg",
    "2024/02/29/134502.jpg": "IMG_20240229_134502.JPG",
    "2024/02/29/134501-12.jpg": "IMG_20240229_134501 (12).JPG",
}
EXPECTED_LEFT = ["notes.txt", "IMG_20230415_101502.JPG.xmp", "IMG_2023_bad.JPG", "VID_20230415_101502.mp4",
                 "holiday list.txt", ".DS_Store"]


def _tree(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            full = os.path.join(dirpath, f)
            with open(full) as fh:
                out[os.path.relpath(full, root)] = fh.read().rstrip("\n")
    return out


def test_photos_tree():
    assert _tree("/data/photos") == EXPECTED_PHOTOS


def test_other_files_stay():
    assert _tree("/data/incoming") == {n: n for n in EXPECTED_LEFT}
