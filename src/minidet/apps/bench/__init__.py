"""``minidet bench``: the weight-free speed benchmark (``benchmark``), its analysis, printed report and chart
(``report``) and its reference, torchvision's own Mask R-CNN with realistic random weights (``reference``)."""
