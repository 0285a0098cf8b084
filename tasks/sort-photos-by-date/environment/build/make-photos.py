"""Build step: camera files in /data/incoming; each file's content is its own original name."""
import os

names = [
    "IMG_20230415_101502.JPG", "IMG_20230415_101502 (1).JPG", "IMG_20230415_101502 (2).jpg",
    "IMG_20230415_174455.jpg", "IMG_20230416_080001.jpeg", "IMG_20230501_090000.JPEG",
    "IMG_20230501_090000 (1).jpeg", "IMG_20231231_235959.JPG", "IMG_20240101_000000.jpg",
    "img_20240102_120000.JPG", "IMG_20240229_134501.Jpg", "IMG_20240229_134502.JPG",
    "IMG_20240229_134501 (12).JPG",
    # not photos of this camera: stay where they are
    "notes.txt", "IMG_20230415_101502.JPG.xmp", "IMG_2023_bad.JPG", "VID_20230415_101502.mp4",
    "holiday list.txt", ".DS_Store",
]
os.makedirs("/data/incoming", exist_ok=True)
os.makedirs("/data/photos", exist_ok=True)
for n in names:
    with open(os.path.join("/data/incoming", n), "w") as fh:
        fh.write(n + "\n")
