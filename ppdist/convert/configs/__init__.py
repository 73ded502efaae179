"""PaddleDetection / PaddleSeg / PaddleOCR configs converted to ppdist's schema."""
