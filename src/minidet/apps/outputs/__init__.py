"""What a run's detections become, for every program (infer, eval, Ray's actors, the benchmark; a server too):

- ``options``: the output options of a run or request, one frozen ``OutputOptions`` (classes kept, lowest score,
  drawing, mask format, polygon tolerance, slicing), built once from a program's arguments;
- ``instances``: detections -> COCO instance dicts (the family's box widths); ``rle``: COCO RLE of masks;
- ``vis``: drawings (boxes, masks, labels); ``video``: video files read and written through OpenCV;
- ``fileio``: atomic writes, output folders and their locks.
"""
