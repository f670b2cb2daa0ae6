"""Sans-IO codecs: bytes in, commands or rejections out; replies back to bytes."""
