/* libimg.so: the library of the library-check image's own, in /opt/imglib. */
int image_library(void) { return 42; }
