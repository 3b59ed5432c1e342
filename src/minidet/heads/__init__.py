"""The heads, one module each: the RPN (``rpn``), the box head and predictor (``box``), Cascade R-CNN's stages
(``cascade``), the mask head (``mask``), Mask Scoring R-CNN's mask IoU head (``mask_iou``), the RoI heads that run
them as one module (``roi``: ``ROI_HEADS``, keyed by ``MODEL.ROI_HEADS.NAME``), and the record they give with its
field table (``detections``)."""
