// Package debianpy computes the host files that Debian's own python3 needs
// to run in a container image built with ociimage.Files: the interpreter,
// its standard library without tests and bytecode caches, chosen
// dist-packages such as pika, and every shared library that the interpreter
// and its extension modules load, found from their ELF dynamic sections.
// It reads the host as it is and installs nothing; on a machine without
// Debian's python3 and the wanted python3-* packages it fails and says
// which package to install.
package debianpy
