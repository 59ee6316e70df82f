"""The package's version, in a module of its own: the runtime keys its cache on it without importing the
package's top level (which imports the API above the runtime)."""

__version__ = "0.1.0"
