"""What a run's detections become, for every program (infer, eval, Ray's actors, the benchmark; a server too):

- ``instances``: detections -> COCO instance dicts (the family's box widths); ``rle``: COCO RLE of masks;
- ``vis``: drawings (boxes, masks, labels); ``video``: video files read and written through OpenCV;
- ``fileio``: atomic writes, output folders and their locks.
"""
