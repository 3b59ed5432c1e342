"""mmdetection's published Mask R-CNN files (its configs' metafile.yml and README.md files), one row each: the
shipped configs are made from mmdetection 3.3.0's own config files (``tools/zoo_configs.py``, the ``reference``
extra) with the keys and notes below."""

from __future__ import annotations

import re
import urllib.parse

from . import ZooFile

_README = "README.md"
_PQ_ONLY = "metafile.yml, which gives the panoptic PQ only, no box or mask AP"
# zoo config (mmdetection 3.3.0's configs/<folder>/<name>.py), published file, box AP, mask AP (None: not published)[,
# where the folder publishes them when not in its metafile.yml]; the file lies under _URL in the folder its name begins
# with (up to its date, its ``_bbox_mAP`` part or its hash), inside the config's folder (or _URL_FOLDER's)
_ZOO: list[tuple] = [
    ("mask_rcnn/mask-rcnn_r50_fpn_1x_coco", "mask_rcnn_r50_fpn_1x_coco_20200205-d4b0c5d6.pth", 38.2, 34.7),
    ("mask_rcnn/mask-rcnn_r50_fpn_2x_coco",
     "mask_rcnn_r50_fpn_2x_coco_bbox_mAP-0.392__segm_mAP-0.354_20200505_003907-3e542a40.pth", 39.2, 35.4),
    ("mask_rcnn/mask-rcnn_r50_fpn_ms-poly-3x_coco",
     "mask_rcnn_r50_fpn_mstrain-poly_3x_coco_20210524_201154-21b550bb.pth", 40.9, 37.1),
    ("mask_rcnn/mask-rcnn_r101_fpn_1x_coco", "mask_rcnn_r101_fpn_1x_coco_20200204-1efe0ed5.pth", 40.0, 36.1),
    ("mask_rcnn/mask-rcnn_r101_fpn_2x_coco",
     "mask_rcnn_r101_fpn_2x_coco_bbox_mAP-0.408__segm_mAP-0.366_20200505_071027-14b391c7.pth", 40.8, 36.6),
    ("mask_rcnn/mask-rcnn_x101-32x4d_fpn_1x_coco",
     "mask_rcnn_x101_32x4d_fpn_1x_coco_20200205-478d0b67.pth", 41.9, 37.5),
    ("mask_rcnn/mask-rcnn_r50-caffe_fpn_1x_coco",
     "mask_rcnn_r50_caffe_fpn_1x_coco_bbox_mAP-0.38__segm_mAP-0.344_20200504_231812-0ebd1859.pth", 38.0, 34.4),
    ("mask_rcnn/mask-rcnn_r50-caffe_fpn_ms-poly-3x_coco",
     "mask_rcnn_r50_caffe_fpn_mstrain-poly_3x_coco_bbox_mAP-0.408__segm_mAP-0.37_20200504_163245-42aa3d00.pth",
     40.8, 37.0),
    ("mask_rcnn/mask-rcnn_x101-32x4d_fpn_2x_coco",
     "mask_rcnn_x101_32x4d_fpn_2x_coco_bbox_mAP-0.422__segm_mAP-0.378_20200506_004702-faef898c.pth", 42.2, 37.8),
    ("mask_rcnn/mask-rcnn_x101-64x4d_fpn_1x_coco",
     "mask_rcnn_x101_64x4d_fpn_1x_coco_20200201-9352eb0d.pth", 42.8, 38.4),
    ("mask_rcnn/mask-rcnn_x101-64x4d_fpn_2x_coco",
     "mask_rcnn_x101_64x4d_fpn_2x_coco_20200509_224208-39d6f70c.pth", 42.7, 38.1),
    ("mask_rcnn/mask-rcnn_r101-caffe_fpn_1x_coco",
     "mask_rcnn_r101_caffe_fpn_1x_coco_20200601_095758-805e06c1.pth", 40.4, 36.4),
    ("mask_rcnn/mask-rcnn_r50-caffe_fpn_ms-poly-2x_coco",
     "mask_rcnn_r50_caffe_fpn_mstrain-poly_2x_coco_bbox_mAP-0.403__segm_mAP-0.365_20200504_231822-a75c98ce.pth",
     40.3, 36.5),
    ("mask_rcnn/mask-rcnn_r101_fpn_ms-poly-3x_coco",
     "mask_rcnn_r101_fpn_mstrain-poly_3x_coco_20210524_200244-5675c317.pth", 42.7, 38.5),
    ("mask_rcnn/mask-rcnn_r101-caffe_fpn_ms-poly-3x_coco",
     "mask_rcnn_r101_caffe_fpn_mstrain-poly_3x_coco_20210526_132339-3c33ce02.pth", 42.9, 38.5),
    ("mask_rcnn/mask-rcnn_x101-32x4d_fpn_ms-poly-3x_coco",
     "mask_rcnn_x101_32x4d_fpn_mstrain-poly_3x_coco_20210524_201410-abcd7859.pth", 43.6, 39.0),
    ("mask_rcnn/mask-rcnn_x101-64x4d_fpn_ms-poly_3x_coco",
     "mask_rcnn_x101_64x4d_fpn_mstrain-poly_3x_coco_20210526_120447-c376f129.pth", 44.5, 39.7),
    ("mask_rcnn/mask-rcnn_x101-32x8d_fpn_1x_coco",
     "mask_rcnn_x101_32x8d_fpn_1x_coco_20220630_173841-0aaf329e.pth", 42.8, 38.3),
    ("mask_rcnn/mask-rcnn_x101-32x8d_fpn_ms-poly-1x_coco",
     "mask_rcnn_x101_32x8d_fpn_mstrain-poly_1x_coco_20220630_170346-b4637974.pth", 43.4, 39.0),
    ("albu_example/mask-rcnn_r50_fpn_albu-1x_coco", "mask_rcnn_r50_fpn_albu_1x_coco_20200208-ab203bcd.pth", 38.0, 34.5),
    ("gcnet/mask-rcnn_r50-syncbn_fpn_1x_coco",
     "mask_rcnn_r50_fpn_syncbn-backbone_1x_coco_20200202-bb3eb55c.pth", 38.4, 34.6),
    ("gcnet/mask-rcnn_r101-syncbn_fpn_1x_coco",
     "mask_rcnn_r101_fpn_syncbn-backbone_1x_coco_20200210-81658c8a.pth", 40.5, 36.3),
    ("gcnet/mask-rcnn_x101-32x4d-syncbn_fpn_1x_coco",
     "mask_rcnn_x101_32x4d_fpn_syncbn-backbone_1x_coco_20200211-7584841c.pth", 42.4, 37.7),
    ("instaboost/mask-rcnn_r50_fpn_instaboost-4x_coco",
     "mask_rcnn_r50_fpn_instaboost_4x_coco_20200307-d025f83a.pth", 40.6, 36.6),
    ("instaboost/mask-rcnn_r101_fpn_instaboost-4x_coco",
     "mask_rcnn_r101_fpn_instaboost_4x_coco_20200703_235738-f23f3a5f.pth", 42.5, 38.0),
    ("instaboost/mask-rcnn_x101-64x4d_fpn_instaboost-4x_coco",
     "mask_rcnn_x101_64x4d_fpn_instaboost_4x_coco_20200515_080947-8ed58c1b.pth", 44.7, 39.7),
    ("lvis/mask-rcnn_r50_fpn_sample1e-3_ms-2x_lvis-v0.5",
     "mask_rcnn_r50_fpn_sample1e-3_mstrain_2x_lvis-dbd06831.pth", 26.1, 25.9),
    ("lvis/mask-rcnn_r101_fpn_sample1e-3_ms-2x_lvis-v0.5",
     "mask_rcnn_r101_fpn_sample1e-3_mstrain_2x_lvis-54582ee2.pth", 27.1, 27.0),
    ("lvis/mask-rcnn_x101-32x4d_fpn_sample1e-3_ms-2x_lvis-v0.5",
     "mask_rcnn_x101_32x4d_fpn_sample1e-3_mstrain_2x_lvis-3cf55ea2.pth", 26.7, 26.9),
    ("lvis/mask-rcnn_x101-64x4d_fpn_sample1e-3_ms-2x_lvis-v0.5",
     "mask_rcnn_x101_64x4d_fpn_sample1e-3_mstrain_2x_lvis-1c99a5ad.pth", 26.4, 26.0),
    ("lvis/mask-rcnn_r50_fpn_sample1e-3_ms-1x_lvis-v1",
     "mask_rcnn_r50_fpn_sample1e-3_mstrain_1x_lvis_v1-aa78ac3d.pth", 22.5, 21.7),
    ("lvis/mask-rcnn_r101_fpn_sample1e-3_ms-1x_lvis-v1",
     "mask_rcnn_r101_fpn_sample1e-3_mstrain_1x_lvis_v1-ec55ce32.pth", 24.6, 23.6),
    ("lvis/mask-rcnn_x101-32x4d_fpn_sample1e-3_ms-1x_lvis-v1",
     "mask_rcnn_x101_32x4d_fpn_sample1e-3_mstrain_1x_lvis_v1-ebbc5c81.pth", 26.7, 25.5),
    ("lvis/mask-rcnn_x101-64x4d_fpn_sample1e-3_ms-1x_lvis-v1",
     "mask_rcnn_x101_64x4d_fpn_sample1e-3_mstrain_1x_lvis_v1-43d9edfe.pth", 27.2, 25.8),
    ("mask_rcnn/mask-rcnn_r50_fpn_amp-1x_coco", "mask_rcnn_r50_fpn_fp16_1x_coco_20200205-59faf7e4.pth", 38.1, 34.7),
    ("pisa/mask-rcnn_r50_fpn_pisa_1x_coco", "pisa_mask_rcnn_r50_fpn_1x_coco-dfcedba6.pth", 39.1, 35.2),
    ("resnet_strikes_back/mask-rcnn_r50-rsb-pre_fpn_1x_coco",
     "mask_rcnn_r50_fpn_rsb-pretrain_1x_coco_20220113_174054-06ce8ba0.pth", 41.2, 38.2),
    ("mask_rcnn/mask-rcnn_x101-32x8d_fpn_ms-poly-3x_coco",
     "mask_rcnn_x101_32x8d_fpn_mstrain-poly_3x_coco_20210607_161042-8bd2c639.pth", 44.3, None),
    ("selfsup_pretrain/mask-rcnn_r50-mocov2-pre_fpn_1x_coco",
     "mask_rcnn_r50_fpn_mocov2-pretrain_1x_coco_20210604_114614-a8b63483.pth", 38.0, 34.3, _README),
    ("selfsup_pretrain/mask-rcnn_r50-mocov2-pre_fpn_ms-2x_coco",
     "mask_rcnn_r50_fpn_mocov2-pretrain_ms-2x_coco_20210605_163717-d95df20a.pth", 40.8, 36.8, _README),
    ("selfsup_pretrain/mask-rcnn_r50-swav-pre_fpn_1x_coco",
     "mask_rcnn_r50_fpn_swav-pretrain_1x_coco_20210604_114640-7b9baf28.pth", 39.1, 35.7, _README),
    ("selfsup_pretrain/mask-rcnn_r50-swav-pre_fpn_ms-2x_coco",
     "mask_rcnn_r50_fpn_swav-pretrain_ms-2x_coco_20210605_163717-08e26fca.pth", 41.3, 37.3, _README),
    ("cityscapes/mask-rcnn_r50_fpn_1x_cityscapes",
     "mask_rcnn_r50_fpn_1x_cityscapes_20201211_133733-d2858245.pth", 40.9, 36.4, _README),
    ("gn/mask-rcnn_r50_fpn_gn-all_2x_coco", "mask_rcnn_r50_fpn_gn-all_2x_coco_20200206-8eee02a6.pth", 40.2, 36.4),
    ("gn/mask-rcnn_r50_fpn_gn-all_3x_coco", "mask_rcnn_r50_fpn_gn-all_3x_coco_20200214-8b23b1e5.pth", 40.5, 36.7),
    ("gn/mask-rcnn_r101_fpn_gn-all_2x_coco", "mask_rcnn_r101_fpn_gn-all_2x_coco_20200205-d96b1b50.pth", 41.9, 37.6),
    ("gn/mask-rcnn_r101_fpn_gn-all_3x_coco",
     "mask_rcnn_r101_fpn_gn-all_3x_coco_20200513_181609-0df864f4.pth", 42.1, 38.0),
    ("gn/mask-rcnn_r50-contrib_fpn_gn-all_2x_coco",
     "mask_rcnn_r50_fpn_gn-all_contrib_2x_coco_20200207-20d3e849.pth", 40.0, 36.1),
    ("gn/mask-rcnn_r50-contrib_fpn_gn-all_3x_coco",
     "mask_rcnn_r50_fpn_gn-all_contrib_3x_coco_20200225-542aefbc.pth", 40.1, 36.2),
    ("gn+ws/mask-rcnn_r50_fpn_gn-ws-all_2x_coco",
     "mask_rcnn_r50_fpn_gn_ws-all_2x_coco_20200226-16acb762.pth", 40.6, 36.6),
    ("gn+ws/mask-rcnn_r101_fpn_gn-ws-all_2x_coco",
     "mask_rcnn_r101_fpn_gn_ws-all_2x_coco_20200212-ea357cd9.pth", 42.0, 37.7),
    ("gn+ws/mask-rcnn_x50-32x4d_fpn_gn-ws-all_2x_coco",
     "mask_rcnn_x50_32x4d_fpn_gn_ws-all_2x_coco_20200216-649fdb6f.pth", 41.1, 37.0),
    ("gn+ws/mask-rcnn_x101-32x4d_fpn_gn-ws-all_2x_coco",
     "mask_rcnn_x101_32x4d_fpn_gn_ws-all_2x_coco_20200319-33fb95b5.pth", 42.1, 37.9),
    ("gn+ws/mask-rcnn_r50_fpn_gn-ws-all_20-23-24e_coco",
     "mask_rcnn_r50_fpn_gn_ws-all_20_23_24e_coco_20200213-487d1283.pth", 41.1, 37.1),
    ("gn+ws/mask-rcnn_r101_fpn_gn-ws-all_20-23-24e_coco",
     "mask_rcnn_r101_fpn_gn_ws-all_20_23_24e_coco_20200213-57b5a50f.pth", 43.1, 38.6),
    ("gn+ws/mask-rcnn_x50-32x4d_fpn_gn-ws-all_20-23-24e_coco",
     "mask_rcnn_x50_32x4d_fpn_gn_ws-all_20_23_24e_coco_20200226-969bcb2c.pth", 42.1, 38.0),
    ("gn+ws/mask-rcnn_x101-32x4d_fpn_gn-ws-all_20-23-24e_coco",
     "mask_rcnn_x101_32x4d_fpn_gn_ws-all_20_23_24e_coco_20200316-e6cd35ef.pth", 42.7, 38.5),
    ("scratch/mask-rcnn_r50-scratch_fpn_gn-all_6x_coco",
     "scratch_mask_rcnn_r50_fpn_gn_6x_bbox_mAP-0.412__segm_mAP-0.374_20200201_193051-1e190a40.pth", 41.2, 37.4),
    ("simple_copy_paste/mask-rcnn_r50_fpn_rpn-2conv_4conv1fc_syncbn-all_32xb2-ssj-270k_coco",
     "mask_rcnn_r50_fpn_syncbn-all_rpn-2conv_ssj_32x2_270k_coco_20220324_182940-33a100c5.pth", 43.5, 39.1),
    ("simple_copy_paste/mask-rcnn_r50_fpn_rpn-2conv_4conv1fc_syncbn-all_32xb2-ssj-90k_coco",
     "mask_rcnn_r50_fpn_syncbn-all_rpn-2conv_ssj_32x2_90k_coco_20220316_181409-f79c84c5.pth", 43.3, 39.0),
    ("simple_copy_paste/mask-rcnn_r50_fpn_rpn-2conv_4conv1fc_syncbn-all_32xb2-ssj-scp-270k_coco",
     "mask_rcnn_r50_fpn_syncbn-all_rpn-2conv_ssj_scp_32x2_270k_coco_20220324_201229-80ee90b7.pth", 45.1, 40.3),
    ("simple_copy_paste/mask-rcnn_r50_fpn_rpn-2conv_4conv1fc_syncbn-all_32xb2-ssj-scp-90k_coco",
     "mask_rcnn_r50_fpn_syncbn-all_rpn-2conv_ssj_scp_32x2_90k_coco_20220316_181307-6bc5726f.pth", 43.8, 39.2),
    ("panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco",
     "panoptic_fpn_r50_fpn_1x_coco_20210821_101153-9668fd13.pth", None, None, _PQ_ONLY),
    ("panoptic_fpn/panoptic-fpn_r50_fpn_ms-3x_coco",
     "panoptic_fpn_r50_fpn_mstrain_3x_coco_20210824_171155-5650f98b.pth", None, None, _PQ_ONLY),
    ("panoptic_fpn/panoptic-fpn_r101_fpn_1x_coco",
     "panoptic_fpn_r101_fpn_1x_coco_20210820_193950-ab9157a2.pth", None, None, _PQ_ONLY),
    ("panoptic_fpn/panoptic-fpn_r101_fpn_ms-3x_coco",
     "panoptic_fpn_r101_fpn_mstrain_3x_coco_20210823_114712-9c99acc4.pth", None, None, _PQ_ONLY),
    ("cascade_rcnn/cascade-mask-rcnn_r50-caffe_fpn_1x_coco",
     "cascade_mask_rcnn_r50_caffe_fpn_1x_coco_bbox_mAP-0.412__segm_mAP-0.36_20200504_174659-5004b251.pth", 41.2, 36.0),
    ("cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco",
     "cascade_mask_rcnn_r50_fpn_1x_coco_20200203-9d4dcb24.pth", 41.2, 35.9),
    ("cascade_rcnn/cascade-mask-rcnn_r50_fpn_20e_coco",
     "cascade_mask_rcnn_r50_fpn_20e_coco_bbox_mAP-0.419__segm_mAP-0.365_20200504_174711-4af8e66e.pth", 41.9, 36.5),
    ("cascade_rcnn/cascade-mask-rcnn_r101-caffe_fpn_1x_coco",
     "cascade_mask_rcnn_r101_caffe_fpn_1x_coco_bbox_mAP-0.432__segm_mAP-0.376_20200504_174813-5c1e9599.pth",
     43.2, 37.6),
    ("cascade_rcnn/cascade-mask-rcnn_r101_fpn_1x_coco",
     "cascade_mask_rcnn_r101_fpn_1x_coco_20200203-befdf6ee.pth", 42.9, 37.3),
    ("cascade_rcnn/cascade-mask-rcnn_r101_fpn_20e_coco",
     "cascade_mask_rcnn_r101_fpn_20e_coco_bbox_mAP-0.434__segm_mAP-0.378_20200504_174836-005947da.pth", 43.4, 37.8),
    ("cascade_rcnn/cascade-mask-rcnn_x101-32x4d_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_1x_coco_20200201-0f411b1f.pth", 44.3, 38.3),
    ("cascade_rcnn/cascade-mask-rcnn_x101-32x4d_fpn_20e_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_20e_coco_20200528_083917-ed1f4751.pth", 45.0, 39.0),
    ("cascade_rcnn/cascade-mask-rcnn_x101-64x4d_fpn_1x_coco",
     "cascade_mask_rcnn_x101_64x4d_fpn_1x_coco_20200203-9a2db89d.pth", 45.3, 39.2),
    ("cascade_rcnn/cascade-mask-rcnn_x101-64x4d_fpn_20e_coco",
     "cascade_mask_rcnn_x101_64x4d_fpn_20e_coco_20200512_161033-bdb5126a.pth", 45.6, 39.5),
    ("cascade_rcnn/cascade-mask-rcnn_r50-caffe_fpn_ms-3x_coco",
     "cascade_mask_rcnn_r50_caffe_fpn_mstrain_3x_coco_20210707_002651-6e29b3a6.pth", 44.0, 38.1),
    ("cascade_rcnn/cascade-mask-rcnn_r50_fpn_ms-3x_coco",
     "cascade_mask_rcnn_r50_fpn_mstrain_3x_coco_20210628_164719-5bdc3824.pth", 44.3, 38.5),
    ("cascade_rcnn/cascade-mask-rcnn_r101-caffe_fpn_ms-3x_coco",
     "cascade_mask_rcnn_r101_caffe_fpn_mstrain_3x_coco_20210707_002620-a5bd2389.pth", 45.4, 39.5),
    ("cascade_rcnn/cascade-mask-rcnn_r101_fpn_ms-3x_coco",
     "cascade_mask_rcnn_r101_fpn_mstrain_3x_coco_20210628_165236-51a2d363.pth", 45.5, 39.6),
    ("cascade_rcnn/cascade-mask-rcnn_x101-32x4d_fpn_ms-3x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_mstrain_3x_coco_20210706_225234-40773067.pth", 46.3, 40.1),
    ("cascade_rcnn/cascade-mask-rcnn_x101-32x8d_fpn_ms-3x_coco",
     "cascade_mask_rcnn_x101_32x8d_fpn_mstrain_3x_coco_20210719_180640-9ff7e76f.pth", 46.1, 39.9),
    ("cascade_rcnn/cascade-mask-rcnn_x101-64x4d_fpn_ms-3x_coco",
     "cascade_mask_rcnn_x101_64x4d_fpn_mstrain_3x_coco_20210719_210311-d3e64ba0.pth", 46.6, 40.3),
    ("dcn/mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_dconv_c3-c5_1x_coco_20200203-4d9ad43b.pth", 41.8, 37.4),
    ("dcn/mask-rcnn_r50-dconv-c3-c5_fpn_amp-1x_coco",
     "mask_rcnn_r50_fpn_fp16_dconv_c3-c5_1x_coco_20210520_180247-c06429d2.pth", 41.9, 37.5),
    ("dcn/mask-rcnn_r101-dconv-c3-c5_fpn_1x_coco",
     "mask_rcnn_r101_fpn_dconv_c3-c5_1x_coco_20200216-a71f5bce.pth", 43.5, 38.9),
    ("dcn/cascade-mask-rcnn_r50-dconv-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_r50_fpn_dconv_c3-c5_1x_coco_20200202-42e767a2.pth", 44.4, 38.6),
    ("dcn/cascade-mask-rcnn_r101-dconv-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_r101_fpn_dconv_c3-c5_1x_coco_20200204-df0c5f10.pth", 45.8, 39.7),
    ("dcn/cascade-mask-rcnn_x101-32x4d-dconv-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_dconv_c3-c5_1x_coco-e75f90c8.pth", 47.3, 41.1),
    ("dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_mdconv_c3-c5_1x_coco_20200203-ad97591f.pth", 41.5, 37.1),
    ("dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_amp-1x_coco",
     "mask_rcnn_r50_fpn_fp16_mdconv_c3-c5_1x_coco_20210520_180434-cf8fefa5.pth", 42.0, 37.6),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_1x_coco_20200310-d5ad2a5e.pth", 44.7, 38.6),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_dconv_c3-c5_1x_coco_20210615_211019-abbc39ea.pth", 47.5, 40.9),
    ("instaboost/cascade-mask-rcnn_r50_fpn_instaboost-4x_coco",
     "cascade_mask_rcnn_r50_fpn_instaboost_4x_coco_20200307-c19d98d9.pth", 43.7, 38.0),
    ("resnet_strikes_back/cascade-mask-rcnn_r50-rsb-pre_fpn_1x_coco",
     "cascade_mask_rcnn_r50_fpn_rsb-pretrain_1x_coco_20220113_193636-8b9ad50f.pth", 44.8, 39.9),
    ("gcnet/mask-rcnn_r50-gcb-r16-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_r16_gcb_c3-c5_1x_coco_20200515_211915-187da160.pth", 39.7, 35.9),
    ("gcnet/mask-rcnn_r50-gcb-r4-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_r4_gcb_c3-c5_1x_coco_20200204-17235656.pth", 39.9, 36.0),
    ("gcnet/mask-rcnn_r101-gcb-r16-c3-c5_fpn_1x_coco",
     "mask_rcnn_r101_fpn_r16_gcb_c3-c5_1x_coco_20200205-e58ae947.pth", 41.3, 37.2),
    ("gcnet/mask-rcnn_r101-gcb-r4-c3-c5_fpn_1x_coco",
     "mask_rcnn_r101_fpn_r4_gcb_c3-c5_1x_coco_20200206-af22dc9d.pth", 42.2, 37.8),
    ("gcnet/mask-rcnn_r50-syncbn-gcb-r16-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_syncbn-backbone_r16_gcb_c3-c5_1x_coco_20200202-587b99aa.pth", 40.4, 36.2),
    ("gcnet/mask-rcnn_r50-syncbn-gcb-r4-c3-c5_fpn_1x_coco",
     "mask_rcnn_r50_fpn_syncbn-backbone_r4_gcb_c3-c5_1x_coco_20200202-50b90e5c.pth", 40.7, 36.5),
    ("gcnet/mask-rcnn_r101-syncbn-gcb-r16-c3-c5_fpn_1x_coco",
     "mask_rcnn_r101_fpn_syncbn-backbone_r16_gcb_c3-c5_1x_coco_20200207-945e77ca.pth", 42.2, 37.8),
    ("gcnet/mask-rcnn_r101-syncbn-gcb-r4-c3-c5_fpn_1x_coco",
     "mask_rcnn_r101_fpn_syncbn-backbone_r4_gcb_c3-c5_1x_coco_20200206-8407a3f0.pth", 42.2, 37.8),
    ("gcnet/mask-rcnn_x101-32x4d-syncbn-gcb-r16-c3-c5_fpn_1x_coco",
     "mask_rcnn_x101_32x4d_fpn_syncbn-backbone_r16_gcb_c3-c5_1x_coco_20200211-cbed3d2c.pth", 43.5, 38.6),
    ("gcnet/mask-rcnn_x101-32x4d-syncbn-gcb-r4-c3-c5_fpn_1x_coco",
     "mask_rcnn_x101_32x4d_fpn_syncbn-backbone_r4_gcb_c3-c5_1x_coco_20200212-68164964.pth", 43.9, 39.0),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-r16-gcb-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_r16_gcb_c3-c5_1x_coco_20200211-10bf2463.pth", 46.2, 39.7),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-r4-gcb-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_r4_gcb_c3-c5_1x_coco_20200703_180653-ed035291.pth", 46.4, 40.1),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5-r16-gcb-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_dconv_c3-c5_r16_gcb_c3-c5_1x_coco_20210615_215648-44aa598a.pth",
     48.0, 41.3),
    ("gcnet/cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5-r4-gcb-c3-c5_fpn_1x_coco",
     "cascade_mask_rcnn_x101_32x4d_fpn_syncbn-backbone_dconv_c3-c5_r4_gcb_c3-c5_1x_coco_20210615_161851-720338ec.pth",
     47.9, 41.1),
    ("ms_rcnn/ms-rcnn_r50-caffe_fpn_1x_coco", "ms_rcnn_r50_caffe_fpn_1x_coco_20200702_180848-61c9355e.pth", 38.2, 36.0),
    ("ms_rcnn/ms-rcnn_r50-caffe_fpn_2x_coco",
     "ms_rcnn_r50_caffe_fpn_2x_coco_bbox_mAP-0.388__segm_mAP-0.363_20200506_004738-ee87b137.pth", 38.8, 36.3),
    ("ms_rcnn/ms-rcnn_r101-caffe_fpn_1x_coco",
     "ms_rcnn_r101_caffe_fpn_1x_coco_bbox_mAP-0.404__segm_mAP-0.376_20200506_004755-b9b12a37.pth", 40.4, 37.6),
    ("ms_rcnn/ms-rcnn_r101-caffe_fpn_2x_coco",
     "ms_rcnn_r101_caffe_fpn_2x_coco_bbox_mAP-0.411__segm_mAP-0.381_20200506_011134-5f3cc74f.pth", 41.1, 38.1),
    ("ms_rcnn/ms-rcnn_x101-32x4d_fpn_1x_coco", "ms_rcnn_x101_32x4d_fpn_1x_coco_20200206-81fd1740.pth", 41.8, 38.7),
    ("ms_rcnn/ms-rcnn_x101-64x4d_fpn_1x_coco", "ms_rcnn_x101_64x4d_fpn_1x_coco_20200206-86ba88d2.pth", 43.0, 39.5),
    ("ms_rcnn/ms-rcnn_x101-64x4d_fpn_2x_coco", "ms_rcnn_x101_64x4d_fpn_2x_coco_20200308-02a445e2.pth", 42.6, 39.5),
    ("regnet/mask-rcnn_regnetx-3.2GF_fpn_1x_coco",
     "mask_rcnn_regnetx-3.2GF_fpn_1x_coco_20200520_163141-2a9d1814.pth", 40.3, 36.6),
    ("regnet/mask-rcnn_regnetx-4GF_fpn_1x_coco",
     "mask_rcnn_regnetx-4GF_fpn_1x_coco_20200517_180217-32e9c92d.pth", 41.5, 37.4),
    ("regnet/mask-rcnn_regnetx-6.4GF_fpn_1x_coco",
     "mask_rcnn_regnetx-6.4GF_fpn_1x_coco_20200517_180439-3a7aae83.pth", 41.0, 37.1),
    ("regnet/mask-rcnn_regnetx-8GF_fpn_1x_coco",
     "mask_rcnn_regnetx-8GF_fpn_1x_coco_20200517_180515-09daa87e.pth", 41.7, 37.5),
    ("regnet/mask-rcnn_regnetx-12GF_fpn_1x_coco",
     "mask_rcnn_regnetx-12GF_fpn_1x_coco_20200517_180552-b538bd8b.pth", 42.2, 38.0),
    ("regnet/mask-rcnn_regnetx-3.2GF-mdconv-c3-c5_fpn_1x_coco",
     "mask_rcnn_regnetx-3.2GF_fpn_mdconv_c3-c5_1x_coco_20200520_172726-75f40794.pth", 40.3, 36.6),
    ("regnet/mask-rcnn_regnetx-3.2GF_fpn_ms-3x_coco",
     "mask_rcnn_regnetx-3.2GF_fpn_mstrain_3x_coco_20200521_202221-99879813.pth", 43.1, 38.7),
    ("regnet/mask-rcnn_regnetx-400MF_fpn_ms-poly-3x_coco",
     "mask_rcnn_regnetx-400MF_fpn_mstrain-poly_3x_coco_20210601_235443-8aac57a4.pth", 37.6, 34.4),
    ("regnet/mask-rcnn_regnetx-800MF_fpn_ms-poly-3x_coco",
     "mask_rcnn_regnetx-800MF_fpn_mstrain-poly_3x_coco_20210602_210641-715d51f5.pth", 39.5, 36.1),
    ("regnet/mask-rcnn_regnetx-1.6GF_fpn_ms-poly-3x_coco",
     "mask_rcnn_regnetx-1_20210602_210641-6764cff5.pth", 40.9, 37.5),
    ("regnet/mask-rcnn_regnetx-4GF_fpn_ms-poly-3x_coco",
     "mask_rcnn_regnetx-4GF_fpn_mstrain-poly_3x_coco_20210602_032621-00f0331c.pth", 43.4, 39.2),
    ("regnet/cascade-mask-rcnn_regnetx-400MF_fpn_ms-3x_coco",
     "cascade_mask_rcnn_regnetx-400MF_fpn_mstrain_3x_coco_20210715_211619-5142f449.pth", 41.6, 36.4),
    ("regnet/cascade-mask-rcnn_regnetx-800MF_fpn_ms-3x_coco",
     "cascade_mask_rcnn_regnetx-800MF_fpn_mstrain_3x_coco_20210715_211616-dcbd13f4.pth", 42.8, 37.6),
    ("regnet/cascade-mask-rcnn_regnetx-1.6GF_fpn_ms-3x_coco",
     "cascade_mask_rcnn_regnetx-1_20210715_211616-75f29a61.pth", 44.5, 39.0),
    ("regnet/cascade-mask-rcnn_regnetx-3.2GF_fpn_ms-3x_coco",
     "cascade_mask_rcnn_regnetx-3_20210715_211616-b9c2c58b.pth", 45.8, 40.0),
    ("regnet/cascade-mask-rcnn_regnetx-4GF_fpn_ms-3x_coco",
     "cascade_mask_rcnn_regnetx-4GF_fpn_mstrain_3x_coco_20210715_212034-cbb1be4c.pth", 45.8, 40.0),
]
_URL = "https://download.openmmlab.com/mmdetection/v2.0/"
_URL_FOLDER = {  # where the file's folder is not named as above
    "mask_rcnn/mask-rcnn_r50_fpn_amp-1x_coco": "fp16/mask_rcnn_r50_fpn_fp16_1x_coco",  # 2.x's mixed precision
    "scratch/mask-rcnn_r50-scratch_fpn_gn-all_6x_coco": "scratch/mask_rcnn_r50_fpn_gn-all_scratch_6x_coco",
    "dcn/mask-rcnn_r50-dconv-c3-c5_fpn_amp-1x_coco": "fp16/mask_rcnn_r50_fpn_fp16_dconv_c3-c5_1x_coco",
    "dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco": "dcn/mask_rcnn_r50_fpn_mdconv_c3-c5_1x_coco",  # dcn's folder
    "dcnv2/mask-rcnn_r50-mdconv-c3-c5_fpn_amp-1x_coco": "fp16/mask_rcnn_r50_fpn_fp16_mdconv_c3-c5_1x_coco",
    # three regnet/ files whose names stop at the "." of their arch (mask_rcnn_regnetx-1_...)
    "regnet/mask-rcnn_regnetx-1.6GF_fpn_ms-poly-3x_coco":
        "regnet/mask_rcnn_regnetx-1.6GF_fpn_mstrain-poly_3x_coco",
    "regnet/cascade-mask-rcnn_regnetx-1.6GF_fpn_ms-3x_coco":
        "regnet/cascade_mask_rcnn_regnetx-1.6GF_fpn_mstrain_3x_coco",
    "regnet/cascade-mask-rcnn_regnetx-3.2GF_fpn_ms-3x_coco":
        "regnet/cascade_mask_rcnn_regnetx-3.2GF_fpn_mstrain_3x_coco",
}


def _url(config: str, file: str) -> str:
    """The published URL of ``file`` of the zoo config ``config`` (``folder/name``)."""
    sub = re.split(r"_(?:bbox_mAP|\d{8}(?=[_-]))|-[0-9a-f]{8}\.pth$", file)[0]
    folder = _URL_FOLDER.get(config, f"{urllib.parse.quote(config.partition('/')[0], safe='')}/{sub}")
    return f"{_URL}{folder}/{file}"


def _source(config: str, where: str = "metafile.yml") -> str:
    return (f"mmdetection's configs/{config.partition('/')[0]}/{where} (URL, AP); the 8 hex digits at the end of "
            "the file name begin its SHA-256 (publish_model.py); no full digest is published")


# the config keys beside what the zoo config says: the class names of a dataset other than COCO
KEYS = {
    "mask-rcnn_r50_fpn_1x_cityscapes":
        {"MODEL.CLASS_NAMES": ["person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle"]},
}
# what the shipped config's comment says of a file beyond its zoo config's name
NOTES = {
    "mask-rcnn_r50_fpn_albu-1x_coco":
        "Albumentations change only the training data; the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50-syncbn_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_r101-syncbn_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_x101-32x4d-syncbn_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_r50_fpn_instaboost-4x_coco":
        "InstaBoost changes only the training data; the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r101_fpn_instaboost-4x_coco":
        "InstaBoost changes only the training data; the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_x101-64x4d_fpn_instaboost-4x_coco":
        "InstaBoost changes only the training data; the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50_fpn_sample1e-3_ms-2x_lvis-v0.5":
        "LVIS: 1230 classes (their category ids are 1 to 1230 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_r101_fpn_sample1e-3_ms-2x_lvis-v0.5":
        "LVIS: 1230 classes (their category ids are 1 to 1230 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_x101-32x4d_fpn_sample1e-3_ms-2x_lvis-v0.5":
        "LVIS: 1230 classes (their category ids are 1 to 1230 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_x101-64x4d_fpn_sample1e-3_ms-2x_lvis-v0.5":
        "LVIS: 1230 classes (their category ids are 1 to 1230 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_r50_fpn_sample1e-3_ms-1x_lvis-v1":
        "LVIS: 1203 classes (their category ids are 1 to 1203 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_r101_fpn_sample1e-3_ms-1x_lvis-v1":
        "LVIS: 1203 classes (their category ids are 1 to 1203 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_x101-32x4d_fpn_sample1e-3_ms-1x_lvis-v1":
        "LVIS: 1203 classes (their category ids are 1 to 1203 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_x101-64x4d_fpn_sample1e-3_ms-1x_lvis-v1":
        "LVIS: 1203 classes (their category ids are 1 to 1203 in class order; named as the file's meta names "
        'them), score threshold 0.0001 and 300 detections per image, as its test_cfg.',
    "mask-rcnn_r50_fpn_amp-1x_coco":
        'Trained in mixed precision; mmdetection tests it in float32 (no fp16 in its test loop), as here.',
    "mask-rcnn_r50_fpn_pisa_1x_coco":
        'PISA reweights the training loss; at test time its RPN keeps 2000 proposals per level and per image.',
    "mask-rcnn_r50-rsb-pre_fpn_1x_coco":
        "The backbone started from timm's ResNet Strikes Back weights; the test-time network is mask_rcnn's.",
    "mask-rcnn_r50-mocov2-pre_fpn_1x_coco":
        'The backbone started from a self-supervised model (SyncBN while training, batch norm with its '
        "running statistics at test time); the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50-mocov2-pre_fpn_ms-2x_coco":
        'The backbone started from a self-supervised model (SyncBN while training, batch norm with its '
        "running statistics at test time); the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50-swav-pre_fpn_1x_coco":
        'The backbone started from a self-supervised model (SyncBN while training, batch norm with its '
        "running statistics at test time); the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50-swav-pre_fpn_ms-2x_coco":
        'The backbone started from a self-supervised model (SyncBN while training, batch norm with its '
        "running statistics at test time); the test-time network and pipeline are mask_rcnn's.",
    "mask-rcnn_r50_fpn_1x_cityscapes":
        "Cityscapes' 8 instance classes, test scale (2048, 1024).",
    "mask-rcnn_r50-contrib_fpn_gn-all_2x_coco":
        "A ResNet-50 GN ImageNet model of mmdetection's contributors: mask_rcnn's data preprocessor.",
    "mask-rcnn_r50-contrib_fpn_gn-all_3x_coco":
        "A ResNet-50 GN ImageNet model of mmdetection's contributors: mask_rcnn's data preprocessor.",
    "mask-rcnn_r50-scratch_fpn_gn-all_6x_coco":
        'Trained from scratch (no ImageNet weights); the test-time network is the gn-all one.',
    "cascade-mask-rcnn_x101-32x8d_fpn_ms-3x_coco":
        "The backbone started from detectron2's ImageNet ResNeXt-101 32x8d (Caffe2-trained): its data "
        "preprocessor takes that model's pixel mean and std in BGR order; style='pytorch'.",
    "mask-rcnn_r50-dconv-c3-c5_fpn_amp-1x_coco":
        'Trained in mixed precision; mmdetection tests it in float32 (no fp16 in its test loop), as here.',
    "mask-rcnn_r50-mdconv-c3-c5_fpn_1x_coco":
        "DCNv2: dcn=dict(type='DCNv2', deform_groups=1), ModulatedDeformConv2dPack in res3 to res5.",
    "mask-rcnn_r50-mdconv-c3-c5_fpn_amp-1x_coco":
        'Trained in mixed precision; mmdetection tests it in float32 (no fp16 in its test loop), as here. '
        "DCNv2: dcn=dict(type='DCNv2', deform_groups=1), ModulatedDeformConv2dPack in res3 to res5.",
    "cascade-mask-rcnn_x101-32x4d-syncbn_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "cascade-mask-rcnn_r50_fpn_instaboost-4x_coco":
        "InstaBoost changes only the training data; the test-time network and pipeline are the cascade's.",
    "cascade-mask-rcnn_r50-rsb-pre_fpn_1x_coco":
        "The backbone started from timm's ResNet Strikes Back weights; the test-time network is the "
        "cascade's.",
    "mask-rcnn_r50-syncbn-gcb-r16-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_r50-syncbn-gcb-r4-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_r101-syncbn-gcb-r16-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_r101-syncbn-gcb-r4-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_x101-32x4d-syncbn-gcb-r16-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "mask-rcnn_x101-32x4d-syncbn-gcb-r4-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN.',
    "cascade-mask-rcnn_x101-32x4d-syncbn-r16-gcb-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN. '
        "GC blocks ending every block of res3 to res5 (ContextBlock ratio 1/16); the rest is the cascade's.",
    "cascade-mask-rcnn_x101-32x4d-syncbn-r4-gcb-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN. '
        "GC blocks ending every block of res3 to res5 (ContextBlock ratio 1/4); the rest is the cascade's.",
    "cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5-r16-gcb-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN. '
        'GC blocks ending every block of res3 to res5 (ContextBlock ratio 1/16), deformable convolution (v1) '
        'in res3 to res5 too.',
    "cascade-mask-rcnn_x101-32x4d-syncbn-dconv-c3-c5-r4-gcb-c3-c5_fpn_1x_coco":
        'SyncBN in the backbone while training: at test time batch norm with its running statistics, as BN. '
        'GC blocks ending every block of res3 to res5 (ContextBlock ratio 1/4), deformable convolution (v1) '
        'in res3 to res5 too.',
    "mask-rcnn_regnetx-3.2GF_fpn_1x_coco":
        "RegNetX-3.2GF (arch='regnetx_3.2gf': depth 25, w_a 26.31, w_0 88, w_m 2.25, group width 48).",
    "mask-rcnn_regnetx-4GF_fpn_1x_coco":
        "RegNetX-4GF (arch='regnetx_4.0gf': depth 23, w_a 38.65, w_0 96, w_m 2.43, group width 40).",
    "mask-rcnn_regnetx-6.4GF_fpn_1x_coco":
        "RegNetX-6.4GF (arch='regnetx_6.4gf': depth 17, w_a 60.83, w_0 184, w_m 2.07, group width 56).",
    "mask-rcnn_regnetx-8GF_fpn_1x_coco":
        "RegNetX-8GF (arch='regnetx_8.0gf': depth 23, w_a 49.56, w_0 80, w_m 2.88, group width 120).",
    "mask-rcnn_regnetx-12GF_fpn_1x_coco":
        "RegNetX-12GF (arch='regnetx_12gf': depth 19, w_a 73.36, w_0 168, w_m 2.37, group width 112).",
    "mask-rcnn_regnetx-3.2GF-mdconv-c3-c5_fpn_1x_coco":
        "RegNetX-3.2GF (arch='regnetx_3.2gf': depth 25, w_a 26.31, w_0 88, w_m 2.25, group width 48). DCNv2 "
        "in res3 to res5: dcn=dict(type='DCNv2', deform_groups=1, fallback_on_stride=False), the grouped 3x3 "
        "conv of each block a ModulatedDeformConv2dPack with the block's groups.",
    "mask-rcnn_regnetx-3.2GF_fpn_ms-3x_coco":
        "RegNetX-3.2GF (arch='regnetx_3.2gf': depth 25, w_a 26.31, w_0 88, w_m 2.25, group width 48).",
    "mask-rcnn_regnetx-400MF_fpn_ms-poly-3x_coco":
        "RegNetX-400MF (arch='regnetx_400mf': depth 22, w_a 24.48, w_0 24, w_m 2.54, group width 16). Its "
        "data preprocessor is mask_rcnn's (RGB, the ImageNet mean and std in RGB order), not the BGR one of "
        'the other RegNet files (Base-mmdetection-regnet.yaml, whose comment describes the RegNet body).',
    "mask-rcnn_regnetx-800MF_fpn_ms-poly-3x_coco":
        "RegNetX-800MF (arch='regnetx_800mf': depth 16, w_a 35.73, w_0 56, w_m 2.28, group width 16). Its "
        "data preprocessor is mask_rcnn's (RGB, the ImageNet mean and std in RGB order), not the BGR one of "
        'the other RegNet files (Base-mmdetection-regnet.yaml, whose comment describes the RegNet body).',
    "mask-rcnn_regnetx-1.6GF_fpn_ms-poly-3x_coco":
        "RegNetX-1.6GF (arch='regnetx_1.6gf': depth 18, w_a 34.01, w_0 80, w_m 2.25, group width 24). Its "
        "data preprocessor is mask_rcnn's (RGB, the ImageNet mean and std in RGB order), not the BGR one of "
        'the other RegNet files (Base-mmdetection-regnet.yaml, whose comment describes the RegNet body).',
    "mask-rcnn_regnetx-4GF_fpn_ms-poly-3x_coco":
        "RegNetX-4GF (arch='regnetx_4.0gf': depth 23, w_a 38.65, w_0 96, w_m 2.43, group width 40). Its data "
        "preprocessor is mask_rcnn's (RGB, the ImageNet mean and std in RGB order), not the BGR one of the "
        'other RegNet files (Base-mmdetection-regnet.yaml, whose comment describes the RegNet body).',
    "cascade-mask-rcnn_regnetx-400MF_fpn_ms-3x_coco":
        "RegNetX-400MF (arch='regnetx_400mf': depth 22, w_a 24.48, w_0 24, w_m 2.54, group width 16).",
    "cascade-mask-rcnn_regnetx-800MF_fpn_ms-3x_coco":
        "RegNetX-800MF (arch='regnetx_800mf': depth 16, w_a 35.73, w_0 56, w_m 2.28, group width 16).",
    "cascade-mask-rcnn_regnetx-1.6GF_fpn_ms-3x_coco":
        "RegNetX-1.6GF (arch='regnetx_1.6gf': depth 18, w_a 34.01, w_0 80, w_m 2.25, group width 24).",
    "cascade-mask-rcnn_regnetx-3.2GF_fpn_ms-3x_coco":
        "RegNetX-3.2GF (arch='regnetx_3.2gf': depth 25, w_a 26.31, w_0 88, w_m 2.25, group width 48).",
    "cascade-mask-rcnn_regnetx-4GF_fpn_ms-3x_coco":
        "RegNetX-4GF (arch='regnetx_4.0gf': depth 23, w_a 38.65, w_0 96, w_m 2.43, group width 40).",
}

ROWS = tuple(
    ZooFile(f"mmdetection/{config.partition('/')[2]}", config, _url(config, file), box, mask, _source(config, *where),
            keys=KEYS.get(config.partition("/")[2], {}), note=NOTES.get(config.partition("/")[2], ""))
    for config, file, box, mask, *where in _ZOO
)
