"""The heads, one module each: the RPN (``rpn``), the box head and predictor (``box``), Cascade R-CNN's stages
(``cascade``), the mask head (``mask``), Mask Scoring R-CNN's mask IoU head (``mask_iou``), and the record they give
(``detections``)."""
