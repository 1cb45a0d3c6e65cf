//! minductor
